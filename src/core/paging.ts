import { ApiError } from './errors.js';

/**
 * The most a page of stored records holds (conversation items, stored responses, stored chat
 * completions), in their stored JSON: a page stops before the record that would pass it, with
 * `has_more` (a first record larger than this is a page of its own). Clients page on with `after`
 * as they would for `limit`. A page of 100 items of 14 MB was one 42 MB reply that held the event
 * loop for seconds.
 */
export const PAGE_BYTES = 4 * 1024 * 1024;

export interface Page<T> {
  data: T[];
  hasMore: boolean;
}

export interface PageRequest {
  after?: string | undefined;
  limit: number;
  order: 'asc' | 'desc';
}

/**
 * A cursor page of a list held whole in memory (a response's input items, a completion's
 * messages), in sending order for `asc`. An `after` the list does not hold is a 400 on `after`.
 */
export function pageOf<T extends { id: string }>(all: readonly T[], page: PageRequest, unknownAfter: (after: string) => string): Page<T> {
  let list = page.order === 'desc' ? [...all].reverse() : all;
  if (page.after !== undefined) {
    const at = list.findIndex((i) => i.id === page.after);
    if (at < 0) throw new ApiError('invalid_value', unknownAfter(page.after), { param: 'after' });
    list = list.slice(at + 1);
  }
  return { data: list.slice(0, page.limit), hasMore: list.length > page.limit };
}
