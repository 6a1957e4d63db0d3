import type { FastifyReply, FastifyRequest } from 'fastify';
import Type, { type Static } from 'typebox';
import type { App, RouteContext } from './context.js';
import { ApiError, isErrorCode } from '../core/errors.js';
import { Cancellation } from '../core/cancellation.js';
import type { Principal } from '../core/principal.js';
import type { EventLog } from '../core/responses/run.js';
import type { ResponseEvent } from '../core/responses/format.js';
import {
  CompactRequestSchema,
  ResponsesRequestSchema,
  decodeCompactRequest,
  decodeIncludeQuery,
  decodeResponsesRequest,
} from '../protocols/responses/request.js';
import { compactionObject, inputTokensObject } from '../protocols/responses/resource.js';
import { IdParams } from '../protocols/responses/conversations.js';
import { PageQuery, listPage } from '../protocols/pages.js';
import { COUNT_MAX } from '../protocols/fields.js';
import { pageOf } from '../core/paging.js';
import { sseFrames } from '../protocols/responses/stream.js';
import { drained, openSse, writeFrames } from './sse.js';
import { abortOnClientGone, whenGone } from './generation.js';

const DONE_FRAME = 'data: [DONE]\n\n';

/** The error a failed response's `error` names (`server_error` is an internal error). */
function failureOf(resource: Record<string, unknown>): ApiError {
  const error = resource['error'] as { code?: unknown; message?: unknown } | null | undefined;
  const code = isErrorCode(error?.code) ? error.code : 'internal_error';
  const message = typeof error?.message === 'string' && error.message !== '' ? error.message : 'The response failed.';
  // A structured output that failed every attempt fails again the same way (docs/decisions.md): the
  // stored failure keeps `x-should-retry: false`, which the SDKs' automatic retries (each billed) heed.
  return new ApiError(code, message, { final: code === 'structured_output_failed' });
}

/**
 * Streams a response's events (from the first) as server-sent events, following it until it ends
 * or the client goes (`gone`, made when the request came in, so a client that left during the
 * awaits before this is seen); `onClientGone` then stops the run itself.
 */
async function streamEvents(
  req: FastifyRequest,
  reply: FastifyReply,
  log: EventLog,
  gone: Cancellation,
  onClientGone?: () => void,
  startingAfter = -1,
): Promise<FastifyReply> {
  if (onClientGone) whenGone(gone, onClientGone);
  if (gone.aborted) return reply;
  openSse(reply);
  // Following a run that may send nothing for a while (resumed past its last event, or queued):
  // the head goes out now, so the client knows it is following.
  if (startingAfter >= 0) reply.raw.flushHeaders();
  const raw = reply.raw;
  let sent = 0;
  /** The last event left out for coming at or before `startingAfter`. */
  let skipped: ResponseEvent | undefined;
  // What is there goes out in one write (the events of one upstream read, or a replay's all).
  for await (const batch of log.batches(gone)) {
    let { start, events } = batch;
    if (startingAfter >= 0 && log.replayed) {
      // A finished response re-rendered from storage is not numbered as its live stream was: what
      // follows any point of that stream is its end, the terminal event carrying the whole response
      // (and for a failed one the error event before it, which some clients read instead).
      events = events.slice(events.at(-2)?.type === 'error' ? -2 : -1);
      start = startingAfter + 1;
    } else if (start <= startingAfter) {
      // A replay `starting_after` a sequence number leaves out what the client already has.
      if (events.length <= startingAfter + 1 - start) {
        skipped = events.at(-1) ?? skipped;
        continue;
      }
      events = events.slice(startingAfter + 1 - start);
      start = startingAfter + 1;
    }
    sent += events.length;
    if (!writeFrames(raw, sseFrames(events, start))) await drained(raw);
  }
  // A running response resumed after the last event it came to have: it ends with its terminal
  // event, as a finished one's replay does after any point (a stream without one leaves the SDKs'
  // stream helpers with no response).
  if (sent === 0 && skipped !== undefined && !gone.aborted) {
    sent = 1;
    writeFrames(raw, sseFrames([skipped], startingAfter + 1));
  }
  // Open Responses: "The terminal event MUST be the literal string [DONE]" (after the response's
  // own terminal event; OpenAI's API sends none, and its SDK, like the others, skips it).
  if (gone.aborted) raw.end();
  else raw.end(DONE_FRAME);
  req.log.debug({ events: sent }, 'response stream ended');
  return reply;
}

/**
 * `GET /v1/responses` without a WebSocket upgrade (the route is responses-socket.ts's): the
 * organization's stored responses, in creation order (`asc`, the default) or the reverse, each the
 * object `GET /v1/responses/{id}` serves.
 */
export async function listResponses(ctx: RouteContext, who: Principal, query: Static<typeof PageQuery>): Promise<Record<string, unknown>> {
  const { after, limit = 20, order = 'asc' } = query;
  const page = await ctx.responses.list(who, { after, limit, order });
  return listPage(page.data, page.hasMore);
}

/**
 * The metrics' `model` label of a request that failed before its model came back (a 429 at
 * admission is counted under its model); none for a model the caller cannot use, which is no
 * series of its own. Only on the failure path: an answered request's label is its resolved model.
 */
function labelFailed(ctx: RouteContext, req: FastifyRequest, id: string): (err: unknown) => never {
  return (err) => {
    try {
      req.metricsModel = ctx.metrics.modelLabel(ctx.pipeline.resolve(id, req.principal!));
    } catch {
      // not a model this caller can use
    }
    throw err;
  };
}

/** The Responses API: create (inline, streamed or in the background), list, read, replay, cancel, delete. */
export function registerResponseRoutes(app: App, ctx: RouteContext): void {
  const { responses } = ctx;

  app.post('/v1/responses', { onRequest: ctx.requireKey, schema: { body: ResponsesRequestSchema } }, async (req, reply) => {
    const gone = abortOnClientGone(reply);
    const body = decodeResponsesRequest(req.body);
    const { run, firstEvents, model, headers } = await responses
      .create(body, req.principal!, { id: req.id, started: req.startedAt })
      .catch(labelFailed(ctx, req, body.model));
    req.metricsModel = ctx.metrics.modelLabel(model);
    reply.headers(headers);
    if (body.stream) {
      // A foreground stream stops when its client leaves; a background one carries on.
      return streamEvents(req, reply, run, gone, body.background ? undefined : () => run.abort.abort());
    }
    if (body.background) {
      await firstEvents;
      return run.resource();
    }
    whenGone(gone, () => run.abort.abort());
    await run.done;
    const resource = run.settled();
    // A foreground response that failed is answered as the error it failed with (stored as failed
    // all the same): the status chat completions answers, and a 5xx the client's SDK retries.
    if (resource['status'] === 'failed') throw failureOf(resource);
    // The text the store was given, rather than serializing the same object again.
    const json = run.settledJson;
    return json === undefined ? resource : reply.type('application/json; charset=utf-8').send(json);
  });

  // Condenses a context into the user's messages and a sealed summary (Open Responses' compaction).
  app.post('/v1/responses/compact', { onRequest: ctx.requireKey, schema: { body: CompactRequestSchema } }, async (req, reply) => {
    const body = decodeCompactRequest(req.body);
    const { compaction, model, headers } = await responses
      .compact(body, req.principal!, { id: req.id, started: req.startedAt })
      .catch(labelFailed(ctx, req, body.model));
    req.metricsModel = ctx.metrics.modelLabel(model);
    reply.headers(headers);
    return compactionObject(compaction);
  });

  // Counts without generating (OpenAI's input-token counting endpoint). A count that is an estimate
  // (an upstream model, whose tokenizer is not here) says so in a header.
  app.post('/v1/responses/input_tokens', { onRequest: ctx.requireKey, schema: { body: ResponsesRequestSchema } }, async (req, reply) => {
    const { tokens, estimated, headers } = await responses.countInputTokens(decodeResponsesRequest(req.body), req.principal!);
    reply.headers(headers);
    if (estimated) reply.header('x-switchyard-estimated', 'true');
    return inputTokensObject(tokens);
  });

  app.get(
    '/v1/responses/:id',
    {
      onRequest: ctx.requireKey,
      schema: {
        params: IdParams,
        querystring: Type.Object({
          stream: Type.Optional(Type.Union([Type.Boolean(), Type.Enum(['true', 'false'])])),
          // OpenAI's: the sequence number after which a resumed stream picks up.
          starting_after: Type.Optional(Type.Integer({ minimum: 0, maximum: COUNT_MAX })),
          include: Type.Optional(Type.Unknown()),
        }),
      },
    },
    async (req, reply) => {
      const include = decodeIncludeQuery(req.query);
      const stream = req.query.stream === true || req.query.stream === 'true';
      if (stream) {
        const gone = abortOnClientGone(reply);
        const log = await responses.replay(req.params.id, req.principal!);
        return streamEvents(req, reply, log, gone, undefined, req.query.starting_after);
      }
      return responses.get(req.params.id, req.principal!, include.includes('reasoning.encrypted_content'));
    },
  );

  app.delete('/v1/responses/:id', { onRequest: ctx.requireKey, schema: { params: IdParams } }, async (req) => {
    await responses.delete(req.params.id, req.principal!);
    return { id: req.params.id, object: 'response', deleted: true };
  });

  app.post('/v1/responses/:id/cancel', { onRequest: ctx.requireKey, schema: { params: IdParams } }, async (req) =>
    responses.cancel(req.params.id, req.principal!),
  );

  app.get(
    '/v1/responses/:id/input_items',
    { onRequest: ctx.requireKey, schema: { params: IdParams, querystring: PageQuery } },
    async (req) => {
      // Checked; nothing it may name adds to an input item here.
      decodeIncludeQuery(req.query);
      const items = await responses.inputItems(req.params.id, req.principal!);
      const { after, limit = 20, order = 'desc' } = req.query;
      const page = pageOf(items, { after, limit, order }, (id) => `No item '${id}' in this response's input.`);
      return listPage(page.data, page.hasMore);
    },
  );
}
