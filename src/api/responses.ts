import type { FastifyReply, FastifyRequest } from 'fastify';
import Type from 'typebox';
import type { App, RouteContext } from '../http/server.js';
import { ApiError } from '../http/errors.js';
import type { Run } from '../core/responses.js';
import type { Item } from '../core/items.js';
import { Instructions, MaxOutputTokens, ModelField, NullableBoolean, Temperature, TopP, nullable } from './limits.js';
import { drained, openSse, writeSse } from './sse.js';

const FunctionTool = Type.Object({
  type: Type.Literal('function'),
  name: Type.String({ pattern: '^[a-zA-Z0-9_.-]{1,64}$' }),
  description: nullable(Type.String()),
  parameters: nullable(Type.Record(Type.String(), Type.Unknown())),
  strict: NullableBoolean,
});

/** `POST /v1/responses` (spec §4.2 with the wire doc's extra fields); unknown fields are ignored. */
export const ResponsesRequestSchema = Type.Object({
  model: ModelField,
  input: Type.Union([Type.String(), Type.Array(Type.Record(Type.String(), Type.Unknown()))]),
  instructions: Instructions,
  max_output_tokens: MaxOutputTokens,
  temperature: Temperature,
  top_p: TopP,
  tools: nullable(Type.Array(FunctionTool)),
  tool_choice: nullable(Type.Union([
    Type.Enum(['auto', 'none', 'required']),
    Type.Object({ type: Type.Literal('function'), name: Type.String() }),
  ])),
  parallel_tool_calls: NullableBoolean,
  stream: NullableBoolean,
  text: nullable(Type.Object({
    format: Type.Optional(Type.Union([
      Type.Object({ type: Type.Enum(['text', 'json_object']) }),
      Type.Object({ type: Type.Literal('json_schema'), name: Type.String(), schema: Type.Record(Type.String(), Type.Unknown()), strict: NullableBoolean }),
    ])),
  })),
  reasoning: nullable(Type.Object({
    effort: nullable(Type.Enum(['none', 'minimal', 'low', 'medium', 'high'])),
    summary: nullable(Type.Enum(['auto', 'concise', 'detailed'])),
  })),
  store: NullableBoolean,
  previous_response_id: nullable(Type.String({ minLength: 1 })),
  conversation: nullable(Type.Union([Type.String({ minLength: 1 }), Type.Object({ id: Type.String({ minLength: 1 }) })])),
  background: NullableBoolean,
  include: nullable(Type.Array(Type.String())),
  metadata: nullable(Type.Record(Type.String({ maxLength: 64 }), Type.String({ maxLength: 512 }), { maxProperties: 16 })),
  truncation: nullable(Type.Enum(['auto', 'disabled'])),
  user: nullable(Type.String()),
});

const IdParams = Type.Object({ id: Type.String() });
export const PageQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100 })),
  after: Type.Optional(Type.String()),
  order: Type.Optional(Type.Enum(['asc', 'desc'])),
});

/** A cursor page of items, in the OpenAI list shape. */
export function itemPage(data: unknown[], hasMore: boolean): Record<string, unknown> {
  const ids = data as Array<{ id?: string }>;
  return { object: 'list', data, first_id: ids[0]?.id ?? null, last_id: ids.at(-1)?.id ?? null, has_more: hasMore };
}

/** Streams a run's events (from the first) as `event:` + `data:` frames, following it until it ends. */
async function streamRun(req: FastifyRequest, reply: FastifyReply, run: Run, onClientGone?: () => void): Promise<FastifyReply> {
  openSse(reply);
  const raw = reply.raw;
  raw.once('close', () => {
    if (!raw.writableFinished) onClientGone?.();
  });
  let sent = 0;
  for (;;) {
    while (sent < run.events.length) {
      const ev = run.events[sent++]!;
      if (!writeSse(raw, JSON.stringify(ev), ev.type)) await drained(raw);
    }
    if (run.finished || raw.destroyed) break;
    await new Promise<void>((resolve) => {
      const wake = () => {
        run.listeners.delete(wake);
        raw.off('close', wake);
        resolve();
      };
      run.listeners.add(wake);
      raw.once('close', wake);
    });
  }
  raw.end();
  req.log.debug({ events: sent }, 'response stream ended');
  return reply;
}

export function registerResponseRoutes(app: App, ctx: RouteContext): void {
  const { responses } = ctx;

  app.post('/v1/responses', { onRequest: ctx.requireKey, schema: { body: ResponsesRequestSchema } }, async (req, reply) => {
    const body = req.body;
    const model = ctx.router.resolve(body.model, req.principal!);
    const admission = await ctx.limiter.admit(req.principal!, model.id);
    reply.headers(admission.headers);
    const { run, firstEvents } = await responses.create(body, req.principal!, model, { id: req.id, started: req.startedAt, settle: admission.settle });
    req.modelId = model.id;
    if (body.stream === true) {
      // A foreground stream stops when its client leaves; a background one carries on.
      return streamRun(req, reply, run, body.background === true ? undefined : () => run.abort.abort());
    }
    if (body.background === true) {
      await firstEvents;
      return structuredClone(run.builder.response);
    }
    reply.raw.once('close', () => {
      if (!reply.raw.writableFinished) run.abort.abort();
    });
    await run.done;
    return run.builder.response;
  });

  app.get('/v1/responses/:id', {
    onRequest: ctx.requireKey,
    schema: { params: IdParams, querystring: Type.Object({ stream: Type.Optional(Type.Union([Type.Boolean(), Type.Enum(['true', 'false'])])), include: Type.Optional(Type.Unknown()) }) },
  }, async (req, reply) => {
    const stream = req.query.stream === true || req.query.stream === 'true';
    if (stream) return streamRun(req, reply, await responses.replay(req.params.id, req.principal!));
    return responses.get(req.params.id, req.principal!);
  });

  app.delete('/v1/responses/:id', { onRequest: ctx.requireKey, schema: { params: IdParams } }, async (req) => {
    await responses.delete(req.params.id, req.principal!);
    return { id: req.params.id, object: 'response', deleted: true };
  });

  app.post('/v1/responses/:id/cancel', { onRequest: ctx.requireKey, schema: { params: IdParams } }, async (req) =>
    responses.cancel(req.params.id, req.principal!));

  app.get('/v1/responses/:id/input_items', { onRequest: ctx.requireKey, schema: { params: IdParams, querystring: PageQuery } }, async (req) => {
    const items = await responses.inputItems(req.params.id, req.principal!);
    const order = req.query.order ?? 'desc';
    const limit = req.query.limit ?? 20;
    let list: Item[] = order === 'desc' ? [...items].reverse() : items;
    if (req.query.after !== undefined) {
      const at = list.findIndex((i) => i.id === req.query.after);
      if (at < 0) throw new ApiError('invalid_value', `No item '${req.query.after}' in this response's input.`, { param: 'after' });
      list = list.slice(at + 1);
    }
    return itemPage(list.slice(0, limit), list.length > limit);
  });
}
