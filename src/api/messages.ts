import { createHash } from 'node:crypto';
import type { App, RouteContext } from './context.js';
import type { Principal } from '../core/principal.js';
import { Cancellation } from '../core/cancellation.js';
import type { ReasoningSeal } from '../core/reasoning-seal.js';
import {
  CountTokensRequest,
  MessagesRequest,
  decodeCountTokensRequest,
  decodeMessagesRequest,
  type ThinkingSignatures,
} from '../protocols/messages/request.js';
import { MessageFold, MessageStreamRenderer, showsThinking, type Sign } from '../protocols/messages/response.js';
import { drained, openSse, writeFrames } from './sse.js';
import { abortOnClientGone, openGeneration, streamFailure } from './generation.js';

const digest = (thinking: string): string => createHash('sha256').update(thinking).digest('base64url');

/**
 * Thinking signatures: the digest of the thinking (and the upstream's own signature, where an
 * Anthropic upstream signed it), sealed for the caller's organization. A client can send the block
 * back in a later turn and the server knows it is the text it produced, with no state kept; another
 * organization's or a changed block fails (reasoning-seal.ts). The upstream signature comes back
 * out, so the thinking can be replayed to Anthropic as it wants it.
 */
function signatures(seal: ReasoningSeal, who: Principal): ThinkingSignatures & { sign: Sign } {
  return {
    // The digest is base64url, so a '.' separates it from the upstream signature unambiguously.
    sign: (thinking, upstream) =>
      seal.seal(upstream === undefined ? digest(thinking) : `${digest(thinking)}.${upstream}`, who.orgId, 'thinking'),
    verify: (thinking, signature) => {
      const payload = seal.unseal(signature, who.orgId, 'thinking');
      if (payload === undefined) return undefined;
      const dot = payload.indexOf('.');
      const hash = dot < 0 ? payload : payload.slice(0, dot);
      return hash === digest(thinking) ? { upstream: dot < 0 ? undefined : payload.slice(dot + 1) } : undefined;
    },
  };
}

/**
 * Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, on every model
 * the caller may use, through the same pipeline (limits, metering, ledger) as the other endpoints.
 * Registered in a scope whose error handler answers in Anthropic's envelope (http/server.ts).
 */
export function registerMessagesRoutes(app: App, ctx: RouteContext): void {
  app.post('/v1/messages', { onRequest: ctx.requireKey, schema: { body: MessagesRequest } }, async (req, reply) => {
    const body = req.body;
    const thinking = signatures(ctx.seal, req.principal!);
    const canonical = decodeMessagesRequest(body, abortOnClientGone(reply), thinking);
    const { model, events } = await openGeneration(ctx, req, reply, canonical, 'messages');
    const shown = showsThinking(body.thinking);

    if (body.stream !== true) {
      try {
        const fold = new MessageFold(thinking.sign, shown);
        for (let ev = await events.next(); ev; ev = await events.next()) fold.apply(ev);
        const message = fold.result(model.id);
        await events.persisted();
        return message;
      } finally {
        await events.close();
      }
    }

    openSse(reply);
    const raw = reply.raw;
    const stream = new MessageStreamRenderer(model.id, thinking.sign, shown);
    try {
      // message_start carries the input tokens, which the engine knows once it has read the prompt.
      let ev = await events.next();
      writeFrames(raw, stream.start(canonical.tally.input, canonical.tally.cached, canonical.tally.cacheWrite));
      for (; ev; ev = await events.next()) {
        if (!writeFrames(raw, stream.event(ev))) await drained(raw);
        if (raw.destroyed) return reply;
      }
      // The stream is complete for the client only with message_stop: its usage record is stored first.
      await events.persisted();
      writeFrames(raw, stream.end());
    } catch (err) {
      writeFrames(raw, MessageStreamRenderer.error(streamFailure(err, req.log)));
    } finally {
      await events.close();
      raw.end();
    }
    return reply;
  });

  // Counts without generating. A count that is an estimate (an upstream model, whose tokenizer is
  // not here) says so in a header, as /v1/responses/input_tokens does.
  app.post('/v1/messages/count_tokens', { onRequest: ctx.requireKey, schema: { body: CountTokensRequest } }, async (req, reply) => {
    const who = req.principal!;
    const canonical = decodeCountTokensRequest(req.body, new Cancellation(), signatures(ctx.seal, who));
    const model = ctx.pipeline.resolve(canonical.model, who);
    const { tokens, estimated, headers } = await ctx.pipeline.countFor(model, canonical, who);
    reply.headers(headers);
    if (estimated) reply.header('x-switchyard-estimated', 'true');
    return { input_tokens: tokens };
  });
}
