/**
 * The playground's requests and how their answers are read, for both APIs: chat completions and
 * Responses. Everything here is the public wire format, the same an SDK sends.
 */
import { isRecord, str } from '../api.js';

export type Mode = 'chat' | 'responses';

export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

export interface UsageInfo {
  input: number;
  cached: number;
  output: number;
  reasoning: number;
  /** US dollars; null when the model has no price for what was used. */
  cost: number | null;
  estimated: boolean;
}

export interface UserTurn {
  role: 'user';
  text: string;
}
export interface ToolTurn {
  role: 'tool';
  callId: string;
  name: string;
  output: string;
}
export interface AssistantTurn {
  role: 'assistant';
  mode: Mode;
  model: string;
  text: string;
  reasoning: string;
  toolCalls: ToolCall[];
  usage: UsageInfo | null;
  finish: string | null;
  error: string | null;
  responseId: string | null;
  streaming: boolean;
  ms: number | null;
}
export type Turn = UserTurn | ToolTurn | AssistantTurn;

export interface Settings {
  model: string;
  mode: Mode;
  system: string;
  temperature: string;
  topP: string;
  maxTokens: string;
  stream: boolean;
  toolsOn: boolean;
  tools: unknown[];
  toolChoice: 'auto' | 'none' | 'required';
  schemaOn: boolean;
  schemaName: string;
  schema: unknown;
  /** Responses only: keep the turns in a stored conversation instead of sending the transcript. */
  conversationId: string | null;
}

export const EXAMPLE_TOOLS = `[
  {
    "type": "function",
    "function": {
      "name": "get_weather",
      "description": "Current weather in a city",
      "parameters": {
        "type": "object",
        "properties": {
          "city": { "type": "string" },
          "unit": { "type": "string", "enum": ["celsius", "fahrenheit"] }
        },
        "required": ["city", "unit"],
        "additionalProperties": false
      }
    }
  }
]`;

export const EXAMPLE_SCHEMA = `{
  "type": "object",
  "properties": {
    "title": { "type": "string" },
    "characters": { "type": "array", "items": { "type": "string" }, "maxItems": 3 }
  },
  "required": ["title", "characters"],
  "additionalProperties": false
}`;

interface FunctionTool {
  name: string;
  description?: string;
  parameters?: unknown;
  strict?: boolean;
}

/** A tool written either way (chat's `{type, function:{…}}` or Responses' flat form) as its parts. */
function functionOf(t: unknown): FunctionTool {
  if (!isRecord(t)) throw new Error('Each tool must be an object.');
  const f = isRecord(t['function']) ? t['function'] : t;
  const name = str(f['name']);
  if (!name) throw new Error('Each tool needs a function name.');
  const out: FunctionTool = { name };
  const description = str(f['description']);
  if (description !== null) out.description = description;
  if (f['parameters'] !== undefined) out.parameters = f['parameters'];
  if (typeof f['strict'] === 'boolean') out.strict = f['strict'];
  return out;
}

/** Checks the tools editor's JSON: an array of function tools. */
export function checkTools(value: unknown): string | null {
  if (!Array.isArray(value)) return 'Tools must be a JSON array.';
  try {
    value.forEach(functionOf);
    return null;
  } catch (err) {
    return err instanceof Error ? err.message : String(err);
  }
}

function numberParam(text: string): number | undefined {
  if (text.trim() === '') return undefined;
  const n = Number(text);
  return Number.isFinite(n) ? n : undefined;
}

function commonParams(s: Settings, names: { maxTokens: string }): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const temperature = numberParam(s.temperature);
  const topP = numberParam(s.topP);
  const maxTokens = numberParam(s.maxTokens);
  if (temperature !== undefined) out['temperature'] = temperature;
  if (topP !== undefined) out['top_p'] = topP;
  if (maxTokens !== undefined) out[names.maxTokens] = Math.round(maxTokens);
  return out;
}

export function chatBody(s: Settings, turns: readonly Turn[]): Record<string, unknown> {
  const messages: Record<string, unknown>[] = [];
  if (s.system.trim() !== '') messages.push({ role: 'system', content: s.system });
  for (const t of turns) {
    if (t.role === 'user') messages.push({ role: 'user', content: t.text });
    else if (t.role === 'tool') messages.push({ role: 'tool', tool_call_id: t.callId, content: t.output });
    else if (t.text !== '' || t.toolCalls.length > 0) {
      messages.push({
        role: 'assistant',
        content: t.text === '' ? null : t.text,
        ...(t.toolCalls.length > 0 && {
          tool_calls: t.toolCalls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } })),
        }),
      });
    }
  }
  const body: Record<string, unknown> = { model: s.model, messages, ...commonParams(s, { maxTokens: 'max_tokens' }) };
  if (s.toolsOn && s.tools.length > 0) {
    body['tools'] = s.tools.map((t) => ({ type: 'function', function: functionOf(t) }));
    body['tool_choice'] = s.toolChoice;
  }
  if (s.schemaOn)
    body['response_format'] = { type: 'json_schema', json_schema: { name: s.schemaName || 'output', schema: s.schema, strict: true } };
  if (s.stream) {
    body['stream'] = true;
    body['stream_options'] = { include_usage: true };
  }
  return body;
}

/**
 * Turns since the last answer the conversation holds: what a stored conversation has not seen yet.
 * An answer that failed was never added to it (the server appends a turn only when it completes),
 * so the turns before it are sent again with the next one.
 */
function newTurns(turns: readonly Turn[]): readonly Turn[] {
  let i = turns.length;
  while (i > 0) {
    const t = turns[i - 1]!;
    if (t.role === 'assistant' && t.error === null) break;
    i--;
  }
  return turns.slice(i);
}

export function responsesBody(s: Settings, turns: readonly Turn[]): Record<string, unknown> {
  const input: Record<string, unknown>[] = [];
  for (const t of s.conversationId !== null ? newTurns(turns) : turns) {
    if (t.role === 'user') input.push({ role: 'user', content: t.text });
    else if (t.role === 'tool') input.push({ type: 'function_call_output', call_id: t.callId, output: t.output });
    else {
      if (t.text !== '') input.push({ role: 'assistant', content: t.text });
      for (const c of t.toolCalls) input.push({ type: 'function_call', call_id: c.id, name: c.name, arguments: c.arguments });
    }
  }
  // `truncation: auto`: a long session leaves out its oldest turns rather than failing once the
  // model's context is full, as a chat window does (small local models have 512 tokens).
  const body: Record<string, unknown> = {
    model: s.model,
    input,
    ...commonParams(s, { maxTokens: 'max_output_tokens' }),
    store: true,
    truncation: 'auto',
  };
  if (s.system.trim() !== '') body['instructions'] = s.system;
  if (s.conversationId !== null) body['conversation'] = s.conversationId;
  if (s.toolsOn && s.tools.length > 0) {
    body['tools'] = s.tools.map((t) => ({ type: 'function', ...functionOf(t) }));
    body['tool_choice'] = s.toolChoice;
  }
  if (s.schemaOn) body['text'] = { format: { type: 'json_schema', name: s.schemaName || 'output', schema: s.schema, strict: true } };
  if (s.stream) body['stream'] = true;
  return body;
}

export function requestOf(s: Settings, turns: readonly Turn[]): { path: string; body: Record<string, unknown> } {
  return s.mode === 'chat'
    ? { path: '/v1/chat/completions', body: chatBody(s, turns) }
    : { path: '/v1/responses', body: responsesBody(s, turns) };
}

function num(v: unknown): number {
  return typeof v === 'number' && Number.isFinite(v) ? v : 0;
}

function costOf(u: Record<string, unknown>): number | null {
  return typeof u['cost'] === 'number' ? u['cost'] : null;
}

export function chatUsage(u: unknown): UsageInfo | null {
  if (!isRecord(u)) return null;
  const prompt = isRecord(u['prompt_tokens_details']) ? u['prompt_tokens_details'] : {};
  const completion = isRecord(u['completion_tokens_details']) ? u['completion_tokens_details'] : {};
  return {
    input: num(u['prompt_tokens']),
    cached: num(prompt['cached_tokens']),
    output: num(u['completion_tokens']),
    reasoning: num(completion['reasoning_tokens']),
    cost: costOf(u),
    estimated: u['estimated'] === true,
  };
}

export function responsesUsage(u: unknown): UsageInfo | null {
  if (!isRecord(u)) return null;
  const input = isRecord(u['input_tokens_details']) ? u['input_tokens_details'] : {};
  const output = isRecord(u['output_tokens_details']) ? u['output_tokens_details'] : {};
  return {
    input: num(u['input_tokens']),
    cached: num(input['cached_tokens']),
    output: num(u['output_tokens']),
    reasoning: num(output['reasoning_tokens']),
    cost: costOf(u),
    estimated: u['estimated'] === true,
  };
}

function errorMessage(v: unknown): string {
  if (isRecord(v)) return str(v['message']) ?? JSON.stringify(v);
  return String(v);
}

/** Folds one chat-completions stream chunk into the answer being built. */
export function applyChatChunk(turn: AssistantTurn, chunk: unknown, calls: Map<number, ToolCall>): void {
  if (!isRecord(chunk)) return;
  if (chunk['error'] !== undefined) {
    turn.error = errorMessage(chunk['error']);
    return;
  }
  const choices = Array.isArray(chunk['choices']) ? chunk['choices'] : [];
  const choice: unknown = choices[0];
  if (isRecord(choice)) {
    const delta = isRecord(choice['delta']) ? choice['delta'] : {};
    const content = str(delta['content']);
    if (content) turn.text += content;
    // A refusal shows as the answer's text, as in Responses mode.
    const refusal = str(delta['refusal']);
    if (refusal) turn.text += refusal;
    const reasoning = str(delta['reasoning_content']) ?? str(delta['reasoning']);
    if (reasoning) turn.reasoning += reasoning;
    if (Array.isArray(delta['tool_calls'])) {
      for (const d of delta['tool_calls'] as unknown[]) {
        if (!isRecord(d)) continue;
        const index = num(d['index']);
        const call = calls.get(index) ?? { id: '', name: '', arguments: '' };
        const f = isRecord(d['function']) ? d['function'] : {};
        call.id = str(d['id']) ?? call.id;
        call.name += str(f['name']) ?? '';
        call.arguments += str(f['arguments']) ?? '';
        calls.set(index, call);
      }
      turn.toolCalls = [...calls.values()].map((c) => ({ ...c }));
    }
    const finish = str(choice['finish_reason']);
    if (finish) turn.finish = finish;
  }
  const usage = chatUsage(chunk['usage']);
  if (usage) turn.usage = usage;
}

/** Reads a whole chat completion object into the answer. */
export function applyChatCompletion(turn: AssistantTurn, completion: unknown): void {
  if (!isRecord(completion)) return;
  const choices = Array.isArray(completion['choices']) ? completion['choices'] : [];
  const choice: unknown = choices[0];
  if (isRecord(choice) && isRecord(choice['message'])) {
    const m = choice['message'];
    turn.text = (str(m['content']) ?? '') + (str(m['refusal']) ?? '');
    turn.reasoning = str(m['reasoning_content']) ?? '';
    turn.toolCalls = (Array.isArray(m['tool_calls']) ? (m['tool_calls'] as unknown[]) : []).filter(isRecord).map((c) => {
      const f = isRecord(c['function']) ? c['function'] : {};
      return { id: str(c['id']) ?? '', name: str(f['name']) ?? '', arguments: str(f['arguments']) ?? '' };
    });
    turn.finish = str(choice['finish_reason']);
  }
  turn.usage = chatUsage(completion['usage']);
}

/** Reads a Responses response object (final or as far as it got) into the answer. */
export function applyResponse(turn: AssistantTurn, response: unknown): void {
  if (!isRecord(response)) return;
  turn.responseId = str(response['id']) ?? turn.responseId;
  const status = str(response['status']);
  const incomplete = isRecord(response['incomplete_details']) ? str(response['incomplete_details']['reason']) : null;
  if (status && status !== 'in_progress' && status !== 'queued') turn.finish = incomplete ? `${status}: ${incomplete}` : status;
  if (status === 'failed') turn.error = errorMessage(response['error']);
  const usage = responsesUsage(response['usage']);
  if (usage) turn.usage = usage;
  const output = Array.isArray(response['output']) ? (response['output'] as unknown[]) : [];
  if (output.length === 0) return;
  let text = '';
  let reasoning = '';
  const calls: ToolCall[] = [];
  for (const item of output) {
    if (!isRecord(item)) continue;
    const parts = Array.isArray(item['content']) ? (item['content'] as unknown[]).filter(isRecord) : [];
    if (item['type'] === 'message') text += parts.map((p) => str(p['text']) ?? str(p['refusal']) ?? '').join('');
    else if (item['type'] === 'reasoning') {
      const summary = Array.isArray(item['summary']) ? (item['summary'] as unknown[]).filter(isRecord) : [];
      reasoning += [...parts, ...summary].map((p) => str(p['text']) ?? '').join('\n');
    } else if (item['type'] === 'function_call') {
      calls.push({ id: str(item['call_id']) ?? '', name: str(item['name']) ?? '', arguments: str(item['arguments']) ?? '' });
    }
  }
  turn.text = text;
  turn.reasoning = reasoning;
  turn.toolCalls = calls;
}

/** Folds one Responses stream event into the answer. */
export function applyResponsesEvent(turn: AssistantTurn, ev: unknown): void {
  if (!isRecord(ev)) return;
  const type = str(ev['type']) ?? '';
  switch (type) {
    case 'response.created':
    case 'response.queued':
    case 'response.in_progress':
      if (isRecord(ev['response'])) turn.responseId = str(ev['response']['id']) ?? turn.responseId;
      return;
    case 'response.output_text.delta':
      turn.text += str(ev['delta']) ?? '';
      return;
    case 'response.refusal.delta':
      turn.text += str(ev['delta']) ?? '';
      return;
    case 'response.reasoning_text.delta':
    case 'response.reasoning_summary_text.delta':
      turn.reasoning += str(ev['delta']) ?? '';
      return;
    case 'response.output_item.done': {
      const item = ev['item'];
      if (isRecord(item) && item['type'] === 'function_call') {
        turn.toolCalls = [
          ...turn.toolCalls,
          { id: str(item['call_id']) ?? '', name: str(item['name']) ?? '', arguments: str(item['arguments']) ?? '' },
        ];
      }
      return;
    }
    case 'response.completed':
    case 'response.incomplete':
    case 'response.failed':
      if (isRecord(ev['response'])) {
        const r = ev['response'];
        const status = str(r['status']);
        const incomplete = isRecord(r['incomplete_details']) ? str(r['incomplete_details']['reason']) : null;
        if (status) turn.finish = incomplete ? `${status}: ${incomplete}` : status;
        if (status === 'failed') turn.error = errorMessage(r['error']);
        const usage = responsesUsage(r['usage']);
        if (usage) turn.usage = usage;
      }
      return;
    case 'error':
      turn.error = errorMessage(isRecord(ev['error']) ? ev['error'] : ev);
      return;
    default:
  }
}

function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** The same request as curl, the openai SDK for JavaScript and for Python (the key stays a variable). */
export function codeFor(path: string, body: Record<string, unknown>, origin: string): { curl: string; js: string; python: string } {
  const json = JSON.stringify(body, null, 2);
  const stream = body['stream'] === true;
  const curl = [
    `curl ${stream ? '-N ' : ''}${origin}${path} \\`,
    `  -H "Authorization: Bearer $SWITCHYARD_API_KEY" \\`,
    `  -H "Content-Type: application/json" \\`,
    `  -d ${shellQuote(json)}`,
  ].join('\n');
  const chat = path === '/v1/chat/completions';
  const call = chat ? 'client.chat.completions.create' : 'client.responses.create';
  const jsRead = chat
    ? stream
      ? `for await (const chunk of result) process.stdout.write(chunk.choices[0]?.delta?.content ?? '');`
      : `console.log(result.choices[0].message, result.usage);`
    : stream
      ? `for await (const event of result) if (event.type === 'response.output_text.delta') process.stdout.write(event.delta);`
      : `console.log(result.output_text, result.usage);`;
  const js = [
    `import OpenAI from 'openai';`,
    ``,
    `const client = new OpenAI({ apiKey: process.env.SWITCHYARD_API_KEY, baseURL: '${origin}/v1' });`,
    `const result = await ${call}(${json});`,
    jsRead,
  ].join('\n');
  const pyRead = chat
    ? stream
      ? `for chunk in result:\n    if chunk.choices and chunk.choices[0].delta.content:\n        print(chunk.choices[0].delta.content, end="")`
      : `print(result.choices[0].message, result.usage)`
    : stream
      ? `for event in result:\n    if event.type == "response.output_text.delta":\n        print(event.delta, end="")`
      : `print(result.output_text, result.usage)`;
  const pyCall = chat ? 'client.chat.completions.create' : 'client.responses.create';
  // The Python SDK takes the request's fields as keyword arguments.
  const kwargs = Object.entries(body)
    .map(([k, v]) => `    ${k}=${toPython(v, 1)},`)
    .join('\n');
  const python = [
    `import os`,
    `from openai import OpenAI`,
    ``,
    `client = OpenAI(api_key=os.environ["SWITCHYARD_API_KEY"], base_url="${origin}/v1")`,
    `result = ${pyCall}(\n${kwargs}\n)`,
    pyRead,
  ].join('\n');
  return { curl, js, python };
}

function toPython(v: unknown, depth: number): string {
  const pad = '    '.repeat(depth + 1);
  const end = '    '.repeat(depth);
  if (v === null || v === undefined) return 'None';
  if (v === true) return 'True';
  if (v === false) return 'False';
  if (typeof v === 'number') return String(v);
  if (typeof v === 'string') return JSON.stringify(v);
  if (Array.isArray(v)) {
    if (v.length === 0) return '[]';
    return `[\n${v.map((x) => `${pad}${toPython(x, depth + 1)},`).join('\n')}\n${end}]`;
  }
  if (isRecord(v)) {
    const entries = Object.entries(v);
    if (entries.length === 0) return '{}';
    return `{\n${entries.map(([k, x]) => `${pad}${JSON.stringify(k)}: ${toPython(x, depth + 1)},`).join('\n')}\n${end}}`;
  }
  return JSON.stringify(v);
}
