import type { FastifyRequest } from 'fastify';
import type { App, RouteContext } from './context.js';
import { ApiError } from '../core/errors.js';
import { ChatRequest, decodeChatRequest } from '../protocols/chat/request.js';
import { ChunkRenderer, CompletionFold, type ChatCompletionObject } from '../protocols/chat/response.js';
import { storeMessages } from '../protocols/chat/stored.js';
import { drained, writeFrames, writeSse, openSse } from './sse.js';
import { abortOnClientGone, openGeneration, streamFailure } from './generation.js';

const JSON_TYPE = 'application/json; charset=utf-8';

/**
 * `store: true`: resolves once the usage record and the finished completion are both in the
 * database, so a completion the client was given is one it can read back. The completion is written
 * while the ledger's group commit is awaited anyway; requests that store nothing never come here
 * and await the usage record alone.
 */
async function persistStored(
  ctx: RouteContext,
  req: FastifyRequest,
  body: ChatRequest,
  events: { persisted(): Promise<void> },
  stored: ChatCompletionObject,
): Promise<void> {
  const saved = ctx.storedCompletions
    .save(req.principal!, { completion: stored, messages: storeMessages(stored.id, body.messages) }, body.metadata ?? {})
    .then(
      () => true,
      (err: unknown) => {
        req.log.error({ err, completion_id: stored.id }, 'storing the chat completion failed');
        return false;
      },
    );
  await events.persisted();
  if (!(await saved)) throw new ApiError('internal_error', 'The completion could not be stored (store: true), so it is not returned.');
}

/** `POST /v1/chat/completions`: decode, run the pipeline, render (one object, or a stream). */
export function registerChatRoutes(app: App, ctx: RouteContext): void {
  app.post('/v1/chat/completions', { onRequest: ctx.requireKey, schema: { body: ChatRequest } }, async (req, reply) => {
    const body = req.body;
    const canonical = decodeChatRequest(body, abortOnClientGone(reply));
    // The same protocol at both ends: a chat-completions upstream may answer in its own frames
    // (the fast lane). A stored completion is folded from canonical events instead.
    if (body.store !== true) {
      canonical.wire = 'chat';
      if (body.stream_options?.include_usage === true) canonical.streamUsage = true;
    }
    const { model, events } = await openGeneration(ctx, req, reply, canonical, 'chat.completions');

    if (body.stream !== true) {
      try {
        const fold = new CompletionFold();
        for (let ev = await events.next(); ev; ev = await events.next()) fold.apply(ev);
        // The fast lane's answer as the upstream wrote it (model name and usage put in): not parsed
        // and serialized again. Never a stored one, which is folded from canonical events.
        const json = fold.json();
        if (json !== undefined) {
          await events.persisted();
          return reply.type(JSON_TYPE).send(json);
        }
        const completion = fold.result(model.id);
        // The answer goes out only once its usage record is stored.
        await (body.store === true && fold.finished ? persistStored(ctx, req, body, events, completion) : events.persisted());
        return completion;
      } finally {
        await events.close();
      }
    }

    openSse(reply);
    const raw = reply.raw;
    const chunks = new ChunkRenderer(model.id, body.stream_options?.include_usage === true);
    // Only a stored stream is folded too; the others pay nothing for the feature.
    const fold = body.store === true ? new CompletionFold() : undefined;
    try {
      for (let ev = await events.next(); ev; ev = await events.next()) {
        fold?.apply(ev);
        if (!writeFrames(raw, chunks.frames(ev))) await drained(raw);
        if (raw.destroyed) return reply;
      }
      // The stream is complete for the client only with [DONE]: its usage record is stored first.
      await (fold?.finished ? persistStored(ctx, req, body, events, fold.result(model.id, chunks.id, chunks.created)) : events.persisted());
      writeFrames(raw, chunks.last());
    } catch (err) {
      writeSse(raw, ChunkRenderer.error(streamFailure(err, req.log)));
    } finally {
      await events.close();
      reply.raw.end();
    }
    return reply;
  });
}
