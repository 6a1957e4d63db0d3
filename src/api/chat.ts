import type { App, RouteContext } from './context.js';
import { ApiError } from '../core/errors.js';
import { ChatRequest, decodeChatRequest } from '../protocols/chat/request.js';
import { ChunkRenderer, CompletionFold } from '../protocols/chat/response.js';
import { drained, writeSse, openSse } from './sse.js';

/** `POST /v1/chat/completions`: decode, run the pipeline, render (one object, or a stream). */
export function registerChatRoutes(app: App, ctx: RouteContext): void {
  app.post('/v1/chat/completions', { onRequest: ctx.requireKey, schema: { body: ChatRequest } }, async (req, reply) => {
    const body = req.body;
    const abort = new AbortController();
    // The client went away before the reply was complete: stop generating and free the slot.
    reply.raw.once('close', () => {
      if (!reply.raw.writableFinished) abort.abort();
    });
    const canonical = decodeChatRequest(body, abort.signal);
    const { model, admission, open } = await ctx.pipeline.start(canonical, req.principal!, {
      endpoint: 'chat.completions',
      requestId: req.id,
      stream: body.stream === true,
      started: req.startedAt,
    });
    req.metricsModel = ctx.metrics.modelLabel(model);
    reply.headers(admission.headers);
    // Errors before the first event (overflow, overload, upstream down) still get a real status.
    const events = await open();

    if (body.stream !== true) {
      try {
        const fold = new CompletionFold();
        for (let ev = await events.next(); ev; ev = await events.next()) fold.apply(ev);
        // The answer goes out only once its usage record is stored.
        await events.persisted();
        return fold.result(model.id);
      } finally {
        await events.close();
      }
    }

    openSse(reply);
    const raw = reply.raw;
    const chunks = new ChunkRenderer(model.id, body.stream_options?.include_usage === true);
    try {
      writeSse(raw, chunks.first());
      for (let ev = await events.next(); ev; ev = await events.next()) {
        const line = chunks.event(ev);
        if (line !== undefined && !writeSse(raw, line)) await drained(raw);
        if (raw.destroyed) return reply;
      }
      // The stream is complete for the client only with [DONE]: its usage record is stored first.
      await events.persisted();
      for (const line of chunks.last()) writeSse(raw, line);
    } catch (err) {
      const e = err instanceof ApiError ? err : new ApiError('internal_error', 'The stream failed.');
      if (!(err instanceof ApiError)) req.log.error({ err }, 'stream failed');
      writeSse(raw, ChunkRenderer.error(e));
    } finally {
      await events.close();
      reply.raw.end();
    }
    return reply;
  });
}
