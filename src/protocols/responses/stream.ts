import type { ApiError } from '../../core/errors.js';
import type { ResponseEvent } from '../../core/responses/format.js';

/**
 * Responses stream events as server-sent events, ready to write: each named by its type, numbered
 * by its place in the stream (`start` for the first; the same number for every follower and for a
 * replay).
 */
export function sseFrames(events: readonly ResponseEvent[], start: number): string {
  let out = '';
  for (let i = 0; i < events.length; i++) {
    const event = events[i]!;
    out += `event: ${event.type}\ndata: ${numbered(event, start + i)}\n\n`;
  }
  return out;
}

/** One Responses stream event as a WebSocket message: the same object as the SSE `data:`. */
export function socketFrame(event: ResponseEvent, index: number): string {
  return numbered(event, index);
}

/**
 * The event's JSON with its sequence number as the last member: written into the text rather than
 * into a copy of the event (events carry no number of their own; every event has a `type`, so the
 * object is never empty). One object spread per streamed event less.
 */
function numbered(event: ResponseEvent, index: number): string {
  const json = JSON.stringify(event);
  return `${json.slice(0, -1)},"sequence_number":${index}}`;
}

/** Open Responses' WebSocket error envelope: the HTTP status it would have had, and the error. */
export function socketError(e: ApiError): string {
  const { error } = e.toBody();
  return JSON.stringify({ type: 'error', status: e.status, error });
}
