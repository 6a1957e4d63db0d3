import Ajv from 'ajv';
const a = new Ajv({coerceTypes:'array',useDefaults:true,strict:false,strictNumbers:true});
const v = a.compile({type:'object',properties:{limit:{type:'integer',minimum:1,maximum:100}}});
for (const x of ['1e400','Infinity','-Infinity','5']) { const o={limit:x}; console.log(x, v(o), o, JSON.stringify(v.errors)); }
