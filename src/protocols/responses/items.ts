import { ApiError } from '../../core/errors.js';
import { newId } from '../../core/ids.js';
import type { InputContent, InputItem, Item, ReasoningItem } from '../../core/items.js';

/** Responses-API input items as a client sends them, read into canonical items (every field checked). */

type Raw = Record<string, unknown>;

/** An element of a list of parts or items: an object, else a 400 naming where it is (never a TypeError, a 500). */
function objectAt(v: unknown, at: string): Raw {
  if (typeof v !== 'object' || v === null || Array.isArray(v))
    throw new ApiError('invalid_value', `${at} must be an object.`, { param: at });
  return v as Raw;
}

function contentParts(raw: unknown, role: string, where: string, field = 'content'): InputContent[] {
  if (typeof raw === 'string') {
    return [role === 'assistant' ? { type: 'output_text', text: raw, annotations: [] } : { type: 'input_text', text: raw }];
  }
  if (!Array.isArray(raw))
    throw new ApiError('invalid_value', `${where}.${field} must be a string or an array of parts.`, { param: `${where}.${field}` });
  return raw.map((element: unknown, j) => {
    const at = `${where}.${field}[${j}]`;
    const p = objectAt(element, at);
    switch (p['type']) {
      case 'input_text':
      case 'text':
        if (typeof p['text'] !== 'string') throw new ApiError('invalid_value', `${at}.text must be a string.`, { param: at });
        return { type: 'input_text', text: p['text'] };
      case 'output_text':
        if (typeof p['text'] !== 'string') throw new ApiError('invalid_value', `${at}.text must be a string.`, { param: at });
        return { type: 'output_text', text: p['text'], annotations: [] };
      case 'refusal':
        return { type: 'refusal', refusal: String(p['refusal'] ?? '') };
      case 'input_image':
        return {
          type: 'input_image',
          ...(typeof p['image_url'] === 'string' && { image_url: p['image_url'] }),
          ...(typeof p['file_id'] === 'string' && { file_id: p['file_id'] }),
          ...(typeof p['detail'] === 'string' && { detail: p['detail'] }),
        };
      default:
        throw new ApiError('unsupported_content', `Content part type '${String(p['type'])}' is not supported.`, { param: `${at}.type` });
    }
  });
}

/**
 * What each role's message may hold (Open Responses' message item params, in OpenAI's words): the
 * model's own parts (`output_text`, `refusal`) only in an assistant turn, images only in a user turn.
 * An assistant turn may still hold `input_text`, which is text either way (OpenAI refuses it; clients
 * that build history by hand send it, and nothing is lost reading it).
 */
function checkPartsOfRole(content: readonly InputContent[], role: string, where: string): void {
  const allowed =
    role === 'assistant' ? ['input_text', 'output_text', 'refusal'] : role === 'user' ? ['input_text', 'input_image'] : ['input_text'];
  content.forEach((p, j) => {
    if (allowed.includes(p.type)) return;
    const named =
      role === 'assistant' ? "'output_text' and 'refusal'" : role === 'user' ? "'input_text' and 'input_image'" : "'input_text'";
    throw new ApiError('invalid_value', `Invalid value: '${p.type}'. Supported values for a ${role} message are: ${named}.`, {
      param: `${where}.content[${j}].type`,
    });
  });
}

/**
 * A function call's output (Open Responses `FunctionCallOutputItemParam.output`, required): a string,
 * or input parts (text and images), kept as parts. Anything else was once turned into its JSON text,
 * which the model then read instead of the output, and a missing one into `""`.
 */
function functionOutput(raw: unknown, item: string): string | InputContent[] {
  const where = `${item}.output`;
  if (typeof raw === 'string') return raw;
  if (raw === undefined || raw === null)
    throw new ApiError('missing_required_parameter', `Missing required parameter: '${where}'.`, { param: where });
  if (!Array.isArray(raw)) throw new ApiError('invalid_value', `${where} must be a string or an array of content parts.`, { param: where });
  const parts = contentParts(raw, 'user', item, 'output');
  parts.forEach((p, j) => {
    if (p.type !== 'input_text' && p.type !== 'input_image')
      throw new ApiError('unsupported_content', `Content part type '${p.type}' is not supported in a function call's output.`, {
        param: `${where}[${j}].type`,
      });
  });
  return parts;
}

/** A reasoning item's `summary` or `content`: an array of `{type, text}` parts of one type, read as their texts. */
function textParts(raw: unknown, where: string, type: string): string[] {
  if (!Array.isArray(raw)) throw new ApiError('invalid_value', `${where} must be an array of '${type}' parts.`, { param: where });
  return raw.map((element: unknown, k) => {
    const at = `${where}[${k}]`;
    const p = objectAt(element, at);
    if (p['type'] !== undefined && p['type'] !== type)
      throw new ApiError('invalid_value', `${at}.type must be '${type}'.`, { param: `${at}.type` });
    return str(p['text'], `${at}.text`);
  });
}

const str = (v: unknown, where: string): string => {
  if (typeof v !== 'string') throw new ApiError('invalid_value', `${where} must be a string.`, { param: where });
  return v;
};

/**
 * A call's id or name: a string that is not empty (Open Responses' `minLength: 1`). An empty one
 * pairs an output with no call an upstream can name. The 64-character cap of that schema is not
 * applied: ids other engines made come back here as they were sent.
 */
const nonEmpty = (v: unknown, where: string): string => {
  const s = str(v, where);
  if (s === '') throw new ApiError('invalid_value', `${where} must not be empty.`, { param: where });
  return s;
};

/**
 * `input` as canonical items with ids (a string is one user message). An `item_reference` is kept as
 * a reference, for core to resolve against what the caller stored.
 */
/** A client's item id: 1 to 256 characters, none of them control characters (they are keys in the database). */
function itemId(raw: Raw, where: string, prefix: string): string {
  const id = raw['id'];
  if (id === undefined || id === null) return newId(prefix);
  if (typeof id !== 'string' || !/^[^\x00-\x1f\x7f]{1,256}$/.test(id)) {
    throw new ApiError('invalid_value', `${where}.id must be a string of 1 to 256 characters without control characters.`, {
      param: `${where}.id`,
    });
  }
  return id;
}

const STATUSES = new Set(['in_progress', 'completed', 'incomplete']);

/**
 * An input item's status: the client's, or `completed` (Open Responses requires one on every
 * message and function item the API returns, as the input items and conversation lists do).
 */
function itemStatus(raw: Raw, where: string): string {
  const status = raw['status'];
  if (status === undefined || status === null) return 'completed';
  if (typeof status !== 'string' || !STATUSES.has(status)) {
    throw new ApiError('invalid_value', `${where}.status must be one of 'in_progress', 'completed', 'incomplete'.`, {
      param: `${where}.status`,
    });
  }
  return status;
}

/** Input items, decoded; `field` is where the request holds them (`input`, or a conversation's `items`), for errors naming them. */
export function decodeInput(input: string | readonly Raw[], field = 'input'): InputItem[] {
  if (typeof input === 'string')
    return [{ id: newId('msg'), type: 'message', role: 'user', status: 'completed', content: [{ type: 'input_text', text: input }] }];
  return input.map((raw, i): InputItem => {
    const where = `${field}[${i}]`;
    // Open Responses lets a reference leave out its type: an object with an id and no message fields.
    const type =
      raw['type'] ?? (raw['id'] !== undefined && raw['role'] === undefined && raw['content'] === undefined ? 'item_reference' : 'message');
    switch (type) {
      case 'message': {
        const role = raw['role'];
        if (role !== 'user' && role !== 'system' && role !== 'developer' && role !== 'assistant') {
          throw new ApiError('invalid_value', `${where}.role must be one of 'user', 'system', 'developer', 'assistant'.`, {
            param: `${where}.role`,
          });
        }
        const phase = raw['phase'];
        if (phase != null && ((phase !== 'commentary' && phase !== 'final_answer') || role !== 'assistant')) {
          throw new ApiError('invalid_value', `${where}.phase must be 'commentary' or 'final_answer', on an assistant message.`, {
            param: `${where}.phase`,
          });
        }
        const content = contentParts(raw['content'], role, where);
        checkPartsOfRole(content, role, where);
        return {
          id: itemId(raw, where, 'msg'),
          type: 'message',
          role,
          status: itemStatus(raw, where),
          content,
          ...(phase != null && { phase }),
        };
      }
      case 'function_call':
        return {
          id: itemId(raw, where, 'fc'),
          type: 'function_call',
          call_id: nonEmpty(raw['call_id'], `${where}.call_id`),
          name: nonEmpty(raw['name'], `${where}.name`),
          arguments: str(raw['arguments'], `${where}.arguments`),
          status: itemStatus(raw, where),
        };
      case 'function_call_output':
        return {
          id: itemId(raw, where, 'fco'),
          type: 'function_call_output',
          call_id: nonEmpty(raw['call_id'], `${where}.call_id`),
          output: functionOutput(raw['output'], where),
          status: itemStatus(raw, where),
        };
      case 'reasoning': {
        // `summary` is required (Open Responses' ReasoningItemParam, and OpenAI refuses an item
        // without it). `content` is null there; an array of reasoning text is accepted too, since
        // clients send a response's output items back as they got them.
        if (raw['summary'] === undefined || raw['summary'] === null)
          throw new ApiError('missing_required_parameter', `Missing required parameter: '${where}.summary'.`, {
            param: `${where}.summary`,
          });
        const summary = textParts(raw['summary'], `${where}.summary`, 'summary_text').map((text) => ({
          type: 'summary_text' as const,
          text,
        }));
        const item: ReasoningItem = { id: itemId(raw, where, 'rs'), type: 'reasoning', summary, status: itemStatus(raw, where) };
        if (raw['content'] !== undefined && raw['content'] !== null)
          item.content = textParts(raw['content'], `${where}.content`, 'reasoning_text').map((text) => ({ type: 'reasoning_text', text }));
        const sealed = raw['encrypted_content'];
        if (sealed !== undefined && sealed !== null) item.encrypted_content = str(sealed, `${where}.encrypted_content`);
        return item;
      }
      case 'compaction':
        return {
          id: itemId(raw, where, 'cmp'),
          type: 'compaction',
          encrypted_content: str(raw['encrypted_content'], `${where}.encrypted_content`),
        };
      case 'item_reference':
        return {
          type: 'item_reference',
          id: raw['id'] === undefined ? str(raw['id'], `${where}.id`) : itemId(raw, where, 'ref'),
          param: `${where}.id`,
        };
      default:
        throw new ApiError('unsupported_content', `Input item type '${String(type)}' is not supported.`, { param: `${where}.type` });
    }
  });
}
