import { setImmediate as nextTurn } from 'node:timers/promises';
import { ApiError } from './errors.js';
import type { ContentPart, Message, MessagePhase, ToolCall } from './canonical.js';

/**
 * Conversation items: the canonical record of a turn's parts (messages, function calls and their
 * outputs, reasoning), as responses produce and conversations keep them. Their shape is the one the
 * Responses API serves (it was modelled on it), so the Responses protocol renders them as they are;
 * parsing what a client sends into them is the protocol's (protocols/responses/items.ts).
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
  /** An assistant message's place in a turn, where the model gives it (Open Responses `phase`). */
  phase?: MessagePhase;
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
  /** Text, or content parts (text and images), kept as the client sent them (Open Responses). */
  output: string | InputContent[];
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
/**
 * The context before it, condensed by `POST /v1/responses/compact`: a summary the model wrote,
 * sealed like reasoning (the client carries it, cannot read or alter it, and cannot use it in
 * another organization).
 */
export interface CompactionItem {
  id: string;
  type: 'compaction';
  encrypted_content: string;
  created_by?: string;
}
export type Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem | CompactionItem;

/** How sealed content in items is opened for an engine (already verified; a failure is the caller's 400). */
export interface SealedText {
  reasoning: (r: ReasoningItem) => string;
  compaction: (c: CompactionItem) => string;
}

/** An input item as a client may send it: an item, or a reference to one stored earlier. */
export type InputItem = Item | { type: 'item_reference'; id: string; param: string };

/**
 * Input items with references replaced by what they refer to (items of the conversation, of the
 * previous responses, or of any stored response of the caller); an unknown reference is a 400.
 */
export function resolveInput(input: readonly InputItem[], lookup: (id: string) => Item | undefined): Item[] {
  return input.map((it) => {
    if (it.type !== 'item_reference') return it;
    const found = lookup(it.id);
    // Another organization's item reads exactly like one that does not exist.
    if (!found) throw new ApiError('not_found', `Item '${it.id}' was not found.`, { param: it.param });
    return found;
  });
}

/**
 * The field of a request's `input[i]` an error names: `field` of the item as sent, or the reference's
 * `id` where the client sent an `item_reference` (`sent`: the input as sent, before references resolved).
 */
export function inputField(sent: readonly InputItem[], i: number, field: string): string {
  return sent[i]?.type === 'item_reference' ? `input[${i}].id` : `input[${i}].${field}`;
}

/** Where the first image in a request's resolved `input` is, as the field that holds it (undefined: none). */
export function firstImage(items: readonly Item[], sent: readonly InputItem[]): string | undefined {
  for (let i = 0; i < items.length; i++) {
    const it = items[i]!;
    const parts = it.type === 'message' ? it.content : it.type === 'function_call_output' && Array.isArray(it.output) ? it.output : [];
    const j = parts.findIndex((p) => p.type === 'input_image');
    if (j >= 0) return inputField(sent, i, `${it.type === 'message' ? 'content' : 'output'}[${j}]`);
  }
  return undefined;
}

/** The index of the first item whose id came before it or is in `existing`; -1 when none. */
function repeatedId(items: readonly Item[], existing: ReadonlySet<string>): number {
  const seen = new Set<string>();
  for (let i = 0; i < items.length; i++) {
    const id = items[i]!.id;
    if (seen.has(id) || existing.has(id)) return i;
    seen.add(id);
  }
  return -1;
}

/**
 * Item ids are unique within a response's input, as OpenAI's Responses API answers (in its words):
 * two items with one id (sent twice, or the same item referenced twice) would be stored as two items
 * that one id finds. A 400 naming the second.
 */
export function checkUniqueInputIds(items: readonly Item[]): void {
  const i = repeatedId(items, new Set());
  if (i >= 0) {
    throw new ApiError(
      'invalid_value',
      `Duplicate item found with id ${items[i]!.id}. Remove duplicate items from your input and try again.`,
      {
        param: `input[${i}]`,
      },
    );
  }
}

/**
 * Item ids are unique within a conversation: an id sent twice in one request, or one the
 * conversation already holds, is a 400 naming the item (never a silently lost turn).
 */
export function checkNewItemIds(items: readonly Item[], existing: ReadonlySet<string>, param: (i: number) => string): void {
  const i = repeatedId(items, existing);
  if (i >= 0) {
    throw new ApiError(
      'invalid_value',
      `An item with id '${items[i]!.id}' is already in this conversation; item ids must be unique within it.`,
      { param: param(i) },
    );
  }
}

/** How much stored JSON is parsed between two turns of the event loop. */
const PARSE_SLICE_BYTES = 1024 * 1024;

/**
 * Parses stored items (a turn's history may be tens of megabytes of JSON), letting the event loop
 * run after about every megabyte so that one turn's history does not hold every other request.
 */
export async function parseItems(json: readonly string[]): Promise<Item[]> {
  const out: Item[] = [];
  let since = 0;
  for (const j of json) {
    if (since > PARSE_SLICE_BYTES) {
      since = 0;
      await nextTurn();
    }
    since += j.length;
    out.push(JSON.parse(j) as Item);
  }
  return out;
}

/**
 * A history cut short (its oldest items left out) starts at a turn: at its first user message or
 * compaction summary, so that no call output or assistant reply is read without what led to it. A
 * part with neither (one long tool loop) starts at its first item that is not a call's output,
 * which upstreams refuse without its call; dropping it all would leave the calls the new input
 * answers behind, and the loop could never go on (a review found it). No output is kept without its
 * call (outside passes found both ways of cutting one off). System and developer messages before
 * the cut stay, as `truncation: "auto"` keeps them when it cuts to the context (a review found a
 * conversation's opening developer prompt dropped).
 */
export function fromTurn(items: readonly Item[]): Item[] {
  let i = items.findIndex((it) => (it.type === 'message' && it.role === 'user') || it.type === 'compaction');
  if (i < 0) i = items.findIndex((it) => it.type !== 'function_call_output' && !isInstruction(it));
  if (i < 0) return items.filter(isInstruction);
  // An output whose call was left out (parallel calls cut between them, or a chain cut between a
  // response's calls and the next one's outputs) goes too; after a compaction summary its calls are
  // no longer items, so outputs there stay.
  const calls = new Set<string>();
  let compacted = false;
  const kept = items.slice(i).filter((it) => {
    if (it.type === 'compaction') compacted = true;
    else if (it.type === 'function_call') calls.add(it.call_id);
    else if (it.type === 'function_call_output') return compacted || calls.has(it.call_id);
    return true;
  });
  const instructions = items.slice(0, i).filter(isInstruction);
  return instructions.length === 0 ? kept : [...instructions, ...kept];
}

/** The system and developer messages a conversation opens with (those before its first other item). */
export function openingInstructions(items: readonly Item[]): Item[] {
  const end = items.findIndex((it) => !isInstruction(it));
  return items.slice(0, end < 0 ? items.length : end);
}

/** A system or developer message: what the model is told, rather than a turn. */
const isInstruction = (it: Item): boolean => it.type === 'message' && (it.role === 'system' || it.role === 'developer');

/**
 * Each function call output in `input` answers a function call made before it (in the history, a
 * previous response's output or the conversation, or earlier in `input`), as OpenAI's Responses API
 * requires ("No tool call found for function call output with call_id …"): a result for no call is a
 * 400 rather than text the model reads out of context. After a compaction item the calls it
 * summarized are no longer items, so outputs after one are not checked.
 */
export function checkOutputsAnswerCalls(history: readonly Item[], input: readonly Item[], param: (i: number) => string): void {
  const calls = new Set<string>();
  let compacted = false;
  const see = (it: Item) => {
    if (it.type === 'function_call') calls.add(it.call_id);
    else if (it.type === 'compaction') compacted = true;
  };
  history.forEach(see);
  input.forEach((it, i) => {
    if (it.type === 'function_call_output' && !compacted && !calls.has(it.call_id)) {
      throw new ApiError('invalid_value', `No function call found for the function call output with call_id '${it.call_id}'.`, {
        param: param(i),
      });
    }
    see(it);
  });
}

function textOf(content: InputContent[]): string {
  return content
    .map((c) => (c.type === 'input_text' || c.type === 'output_text' ? c.text : c.type === 'refusal' ? c.refusal : ''))
    .join('');
}

/**
 * Content parts as an engine reads them: one text part as its text, several parts as parts (an
 * engine that needs one string joins them by lines; they were run together, "Hello" and "world"
 * as "Helloworld").
 */
function partsOf(content: InputContent[]): string | ContentPart[] {
  if (content.length <= 1 && !content.some((c) => c.type === 'input_image')) return textOf(content);
  return content.flatMap((c): ContentPart[] =>
    c.type === 'input_image'
      ? c.image_url
        ? [{ type: 'image', url: c.image_url, ...(c.detail && { detail: c.detail }) }]
        : []
      : [{ type: 'text', text: textOf([c]) }],
  );
}

/**
 * Items → canonical messages for an engine. Consecutive function calls become one assistant turn;
 * reasoning (given as `reasoningText`, already decrypted where it was sealed) goes into the next
 * assistant turn.
 */
export function itemsToMessages(items: readonly Item[], instructions: string | null | undefined, sealed: SealedText): Message[] {
  const out: Message[] = [];
  if (instructions) out.push({ role: 'developer', content: instructions });
  let pendingReasoning = '';
  for (const it of items) {
    switch (it.type) {
      case 'message': {
        const msg: Message = { role: it.role, content: partsOf(it.content) };
        if (it.phase !== undefined && it.role === 'assistant') msg.phase = it.phase;
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
        // Parts are read as a message's are: their text, or text and images where there are images.
        out.push({ role: 'tool', content: typeof it.output === 'string' ? it.output : partsOf(it.output), toolCallId: it.call_id });
        break;
      case 'reasoning':
        pendingReasoning += sealed.reasoning(it);
        break;
      case 'compaction':
        // What the summary replaced came before it; the model reads it as context from the operator.
        out.push({ role: 'developer', content: `Summary of the earlier conversation:\n${sealed.compaction(it)}` });
        break;
    }
  }
  return out;
}
