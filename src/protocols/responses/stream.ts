import type { ResponseEvent } from '../../core/responses/format.js';

/**
 * One Responses stream event as a server-sent event: named by its type, numbered by its place in
 * the stream (the same number for every follower and for a replay).
 */
export function sseFrame(event: ResponseEvent, index: number): { name: string; data: string } {
  return { name: event.type, data: JSON.stringify({ ...event, sequence_number: index }) };
}
