/**
 * One depth-first walk over a parsed JSON value, without recursion: JSON.parse reads any depth, so
 * a recursive walk over a client's document could overflow the stack on a body of a few KB. Used
 * wherever a client's or an upstream's JSON is bounded before it is compiled or serialized (schema
 * limits, nesting of tool arguments).
 */

/** A value met on the walk: its depth (the root is 0), the key or index it sits under, its parent. */
export interface JsonNode {
  readonly value: unknown;
  readonly depth: number;
  readonly key: string | number | undefined;
  readonly parent: JsonNode | undefined;
}

/**
 * Visits every value under `root` (objects, arrays and scalars), parents before children, array
 * items in order. The visitor returns `true` to end the walk there; `walkJson` then returns `true`.
 * Paths are not built on the way (most walks never need one): `jsonPointer` builds a node's.
 */
export function walkJson(root: unknown, visit: (node: JsonNode) => boolean | void): boolean {
  const stack: JsonNode[] = [{ value: root, depth: 0, key: undefined, parent: undefined }];
  for (let node = stack.pop(); node !== undefined; node = stack.pop()) {
    if (visit(node) === true) return true;
    const { value, depth } = node;
    if (typeof value !== 'object' || value === null) continue;
    if (Array.isArray(value)) {
      for (let i = value.length - 1; i >= 0; i--) stack.push({ value: value[i], depth: depth + 1, key: i, parent: node });
    } else {
      const obj = value as Record<string, unknown>;
      for (const key in obj) stack.push({ value: obj[key], depth: depth + 1, key, parent: node });
    }
  }
  return false;
}

/** The node's place as a JSON Pointer ('' for the root; keys are not escaped, as it is only shown). */
export function jsonPointer(node: JsonNode): string {
  const keys: Array<string | number> = [];
  for (let n: JsonNode | undefined = node; n?.key !== undefined; n = n.parent) keys.push(n.key);
  return keys
    .reverse()
    .map((k) => `/${k}`)
    .join('');
}
