import { newId } from './ids.js';
import { ApiError } from '../http/errors.js';
import type { ContentPart, Message, ToolCall } from './canonical.js';

/**
 * Responses-API items as they are stored and served: the input a client sent (normalised, with
 * ids) and the output a response produced. Conversations and `previous_response_id` chains are
 * lists of these.
 */
export type InputContent =
  | { type: 'input_text'; text: string }
  | { type: 'input_image'; image_url?: string; file_id?: string; detail?: string }
  | { type: 'output_text'; text: string; annotations: unknown[] }
  | { type: 'refusal'; refusal: string };

export interface MessageItem {
  id: string;
  type: 'message';
  role: 'user' | 'system' | 'developer' | 'assistant';
  status?: string;
  content: InputContent[];
}
export interface FunctionCallItem {
  id: string;
  type: 'function_call';
  call_id: string;
  name: string;
  arguments: string;
  status?: string;
}
export interface FunctionCallOutputItem {
  id: string;
  type: 'function_call_output';
  call_id: string;
  output: string;
  status?: string;
}
export interface ReasoningItem {
  id: string;
  type: 'reasoning';
  summary: Array<{ type: 'summary_text'; text: string }>;
  content?: Array<{ type: 'reasoning_text'; text: string }>;
  encrypted_content?: string;
  status?: string;
}
export type Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem;

export { newId };

type Raw = Record<string, unknown>;

function contentParts(raw: unknown, role: string, where: string): InputContent[] {
  if (typeof raw === 'string') {
    return [role === 'assistant' ? { type: 'output_text', text: raw, annotations: [] } : { type: 'input_text', text: raw }];
  }
  if (!Array.isArray(raw)) throw new ApiError('invalid_value', `${where}.content must be a string or an array of parts.`, { param: `${where}.content` });
  return raw.map((p: Raw, j) => {
    const at = `${where}.content[${j}]`;
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

const str = (v: unknown, where: string): string => {
  if (typeof v !== 'string') throw new ApiError('invalid_value', `${where} must be a string.`, { param: where });
  return v;
};

/**
 * Normalises `input` into items with ids. `item_reference`s are resolved with `lookup` (items of the
 * conversation or of the previous responses); an unknown reference is a 400.
 */
export function normaliseInput(input: string | Raw[], lookup: (id: string) => Item | undefined): Item[] {
  if (typeof input === 'string') return [{ id: newId('msg'), type: 'message', role: 'user', content: [{ type: 'input_text', text: input }] }];
  return input.map((raw, i): Item => {
    const where = `input[${i}]`;
    const type = raw['type'] ?? 'message';
    switch (type) {
      case 'message': {
        const role = raw['role'];
        if (role !== 'user' && role !== 'system' && role !== 'developer' && role !== 'assistant') {
          throw new ApiError('invalid_value', `${where}.role must be one of 'user', 'system', 'developer', 'assistant'.`, { param: `${where}.role` });
        }
        return { id: typeof raw['id'] === 'string' ? raw['id'] : newId('msg'), type: 'message', role, content: contentParts(raw['content'], role, where) };
      }
      case 'function_call':
        return {
          id: typeof raw['id'] === 'string' ? raw['id'] : newId('fc'), type: 'function_call',
          call_id: str(raw['call_id'], `${where}.call_id`), name: str(raw['name'], `${where}.name`), arguments: str(raw['arguments'], `${where}.arguments`),
        };
      case 'function_call_output': {
        const output = raw['output'];
        return {
          id: typeof raw['id'] === 'string' ? raw['id'] : newId('fco'), type: 'function_call_output',
          call_id: str(raw['call_id'], `${where}.call_id`), output: typeof output === 'string' ? output : JSON.stringify(output ?? ''),
        };
      }
      case 'reasoning': {
        const summary = Array.isArray(raw['summary']) ? (raw['summary'] as Raw[]).map((s) => ({ type: 'summary_text' as const, text: String(s['text'] ?? '') })) : [];
        const item: ReasoningItem = { id: typeof raw['id'] === 'string' ? raw['id'] : newId('rs'), type: 'reasoning', summary };
        if (Array.isArray(raw['content'])) item.content = (raw['content'] as Raw[]).map((c) => ({ type: 'reasoning_text', text: String(c['text'] ?? '') }));
        if (typeof raw['encrypted_content'] === 'string') item.encrypted_content = raw['encrypted_content'];
        return item;
      }
      case 'item_reference': {
        const id = str(raw['id'], `${where}.id`);
        const found = lookup(id);
        if (!found) throw new ApiError('invalid_value', `Item '${id}' was not found.`, { param: `${where}.id` });
        return found;
      }
      default:
        throw new ApiError('unsupported_content', `Input item type '${String(type)}' is not supported.`, { param: `${where}.type` });
    }
  });
}

function textOf(content: InputContent[]): string {
  return content.map((c) => (c.type === 'input_text' || c.type === 'output_text' ? c.text : c.type === 'refusal' ? c.refusal : '')).join('');
}

/**
 * Items → canonical messages for an engine. Consecutive function calls become one assistant turn;
 * reasoning (given as `reasoningText`, already decrypted where it was sealed) goes into the next
 * assistant turn.
 */
export function itemsToMessages(items: readonly Item[], instructions: string | null | undefined, reasoningText: (r: ReasoningItem) => string): Message[] {
  const out: Message[] = [];
  if (instructions) out.push({ role: 'developer', content: instructions });
  let pendingReasoning = '';
  for (const it of items) {
    switch (it.type) {
      case 'message': {
        const hasImage = it.content.some((c) => c.type === 'input_image');
        const content: string | ContentPart[] = hasImage
          ? it.content.flatMap((c): ContentPart[] => c.type === 'input_image'
            ? (c.image_url ? [{ type: 'image', url: c.image_url, ...(c.detail && { detail: c.detail }) }] : [])
            : [{ type: 'text', text: textOf([c]) }])
          : textOf(it.content);
        const msg: Message = { role: it.role, content };
        if (it.role === 'assistant' && pendingReasoning) {
          msg.reasoning = pendingReasoning;
          pendingReasoning = '';
        }
        out.push(msg);
        break;
      }
      case 'function_call': {
        const call: ToolCall = { id: it.call_id, name: it.name, arguments: it.arguments };
        const last = out.at(-1);
        if (last?.role === 'assistant' && last.toolCalls && !last.content) last.toolCalls.push(call);
        else {
          const msg: Message = { role: 'assistant', content: null, toolCalls: [call] };
          if (pendingReasoning) {
            msg.reasoning = pendingReasoning;
            pendingReasoning = '';
          }
          out.push(msg);
        }
        break;
      }
      case 'function_call_output':
        out.push({ role: 'tool', content: it.output, toolCallId: it.call_id });
        break;
      case 'reasoning':
        pendingReasoning += reasoningText(it);
        break;
    }
  }
  return out;
}
