import { ApiError } from '../../core/errors.js';
import type { FinishReason, GenerationEvent, GenerationRequest, Message } from '../../core/canonical.js';
import {
  MAX_TOOL_CALLS,
  obj,
  reported,
  str,
  upstreamFailure,
  wireTool,
  type Clean,
  type ReportedUsage,
  type StreamReader,
} from '../reader.js';

/**
 * The client side of the Responses API, for deployments that speak it natively: a canonical
 * request as a streamed, unstored Responses request, and its stream events read back into
 * canonical events.
 */

/** Canonical messages as Responses input items. */
function responsesInput(messages: readonly Message[]): Record<string, unknown>[] {
  const items: Record<string, unknown>[] = [];
  for (const m of messages) {
    const content =
      typeof m.content === 'string' || m.content === null
        ? m.content
        : m.content.map((p) =>
            p.type === 'text'
              ? { type: m.role === 'assistant' ? 'output_text' : 'input_text', text: p.text }
              : { type: 'input_image', image_url: p.url, ...(p.detail && { detail: p.detail }) },
          );
    if (m.role === 'tool') {
      // A tool's result in parts (chat's array content, Responses' parts) goes on as parts.
      items.push({ type: 'function_call_output', call_id: m.toolCallId ?? '', output: content ?? '' });
      continue;
    }
    if (content !== null && content !== '') items.push({ role: m.role, content, ...(m.phase && { phase: m.phase }) });
    for (const c of m.toolCalls ?? []) items.push({ type: 'function_call', call_id: c.id, name: c.name, arguments: c.arguments });
  }
  return items;
}

export function encodeResponsesRequest(req: GenerationRequest, upstreamModel: string): Record<string, unknown> {
  const s = req.sampling;
  const body: Record<string, unknown> = { model: upstreamModel, input: responsesInput(req.messages), stream: true, store: false };
  if (s.temperature !== undefined) body['temperature'] = s.temperature;
  if (s.topP !== undefined) body['top_p'] = s.topP;
  // Open Responses has the penalties; an upstream that does not know them ignores unknown fields.
  if (s.presencePenalty !== undefined) body['presence_penalty'] = s.presencePenalty;
  if (s.frequencyPenalty !== undefined) body['frequency_penalty'] = s.frequencyPenalty;
  if (req.maxOutputTokens !== undefined) body['max_output_tokens'] = req.maxOutputTokens;
  if (req.tools?.length) {
    body['tools'] = req.tools.map((t) => ({ type: 'function', ...wireTool(t) }));
    if (req.toolChoice !== undefined)
      body['tool_choice'] = typeof req.toolChoice === 'string' ? req.toolChoice : { type: 'function', name: req.toolChoice.name };
    if (req.parallelToolCalls !== undefined) body['parallel_tool_calls'] = req.parallelToolCalls;
  }
  const f = req.responseFormat;
  if (f && f.type !== 'text') {
    body['text'] = {
      format:
        f.type === 'json_schema'
          ? // A name is required upstream; the client may have left it out (echoed to it as "").
            { type: 'json_schema', name: f.name || 'response', schema: f.schema, ...(f.strict !== undefined && { strict: f.strict }) }
          : { type: 'json_object' },
    };
  }
  if (req.reasoningEffort !== undefined) body['reasoning'] = { effort: req.reasoningEffort };
  return body;
}

/** Responses API stream events, for deployments that speak it natively. */
export class ResponsesReader implements StreamReader {
  finish: FinishReason = 'stop';
  usage: ReportedUsage | undefined;
  private readonly calls = new Map<string, number>();
  private readonly rawReasoning = new Set<string>();

  constructor(private readonly clean: Clean) {}

  read(data: unknown, out: GenerationEvent[]): boolean {
    const ev = obj(data);
    if (!ev) throw new ApiError('upstream_error', 'The upstream sent an event that is not a JSON object.');
    const delta = str(ev['delta']);
    const itemId = str(ev['item_id']) ?? '';
    switch (ev['type']) {
      case 'response.output_text.delta':
        if (delta) out.push({ type: 'text.delta', text: delta });
        return false;
      case 'response.refusal.delta':
        if (delta) out.push({ type: 'refusal.delta', text: delta });
        return false;
      case 'response.reasoning_text.delta':
      case 'response.reasoning.delta':
        this.rawReasoning.add(itemId);
        if (delta) out.push({ type: 'reasoning.delta', text: delta });
        return false;
      case 'response.reasoning_summary_text.delta':
        // A summary only stands in for reasoning the upstream did not send in full.
        if (delta && !this.rawReasoning.has(itemId)) out.push({ type: 'reasoning.delta', text: delta });
        return false;
      case 'response.output_item.added': {
        const item = obj(ev['item']);
        const phase = item?.['phase'];
        if (item?.['type'] === 'message' && (phase === 'commentary' || phase === 'final_answer'))
          out.push({ type: 'message.phase', phase });
        if (item?.['type'] === 'function_call') {
          const index = this.calls.size;
          if (index >= MAX_TOOL_CALLS) throw new ApiError('upstream_error', 'The upstream sent too many tool calls.');
          this.calls.set(str(item['id']) ?? String(index), index);
          out.push({
            type: 'tool_call.start',
            index,
            id: this.clean(str(item['call_id']) || `call_${index}`),
            name: this.clean(str(item['name']) ?? ''),
          });
        }
        return false;
      }
      case 'response.function_call_arguments.delta': {
        const index = this.calls.get(itemId);
        if (index !== undefined && delta) out.push({ type: 'tool_call.delta', index, arguments: delta });
        return false;
      }
      case 'response.completed':
      case 'response.incomplete': {
        const r = obj(ev['response']) ?? {};
        const u = obj(r['usage']);
        if (u) {
          this.usage = reported(
            u['input_tokens'],
            obj(u['input_tokens_details'])?.['cached_tokens'],
            u['output_tokens'],
            obj(u['output_tokens_details'])?.['reasoning_tokens'],
          );
        }
        if (ev['type'] === 'response.incomplete')
          this.finish = obj(r['incomplete_details'])?.['reason'] === 'content_filter' ? 'content_filter' : 'length';
        else this.finish = this.calls.size > 0 ? 'tool_calls' : 'stop';
        return true;
      }
      case 'response.failed':
        throw upstreamFailure(obj(obj(ev['response'])?.['error'])?.['message'] ?? 'the response failed', this.clean);
      case 'error':
        throw upstreamFailure(ev['message'] ?? obj(ev['error'])?.['message'], this.clean);
      default:
        return false;
    }
  }
}
