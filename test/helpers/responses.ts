import assert from 'node:assert/strict';
import type { SseEvent } from './server.js';

export interface WireResponse {
  id: string;
  status: string;
  output: Array<{ id: string; type: string; content?: Array<{ type: string; text: string }> }>;
  error: { code: string; message: string } | null;
  background: boolean;
}

export type Ev = {
  type: string;
  sequence_number: number;
  output_index?: number;
  item_id?: string;
  item?: { id: string; type: string };
  response?: WireResponse;
};

/** Checks a Responses event stream against the wire doc: numbering, first event, one terminal, item ids. */
export function checkStream(events: SseEvent[]): Ev[] {
  const parsed = events.map((e) => {
    const d = JSON.parse(e.data) as Ev;
    assert.equal(d.type, e.event, 'event: line equals data.type');
    return d;
  });
  parsed.forEach((d, i) => assert.equal(d.sequence_number, i, 'sequence_number counts from 0 by 1'));
  assert.equal(parsed[0]!.type, 'response.created');
  const terminals = parsed.filter((d) => ['response.completed', 'response.incomplete', 'response.failed'].includes(d.type));
  assert.equal(terminals.length, 1, 'exactly one terminal event');
  assert.equal(parsed.at(-1), terminals[0], 'the terminal event is last');
  // Open Responses: an error while streaming is an `error` event, followed by `response.failed`.
  parsed.forEach((d, i) => {
    if (d.type !== 'error') return;
    const failed = parsed[i + 1];
    assert.equal(failed?.type, 'response.failed', 'an error event is followed by response.failed');
    const error = (d as unknown as { error: { type: string; code: string; message: string; param: null } }).error;
    assert.deepEqual([error.code, error.message], [failed!.response!.error!.code, failed!.response!.error!.message]);
    assert.equal(typeof error.type, 'string');
    assert.equal(error.param, null);
  });
  if (terminals[0]!.type === 'response.failed') assert.equal(parsed.at(-2)?.type, 'error', 'response.failed follows an error event');
  const ids = new Set(parsed.filter((d) => d.response).map((d) => d.response!.id));
  assert.equal(ids.size, 1, 'one response id throughout');
  const added = parsed.filter((d) => d.type === 'response.output_item.added');
  added.forEach((d, i) => assert.equal(d.output_index, i, 'output_index appended in order'));
  for (const d of parsed)
    if (d.item_id !== undefined)
      assert.ok(
        added.some((a) => a.item!.id === d.item_id),
        'item_id names an added item',
      );
  return parsed;
}
