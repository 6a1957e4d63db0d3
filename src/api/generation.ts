import type { FastifyBaseLogger, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../core/errors.js';
import { Cancellation } from '../core/cancellation.js';
import type { RouteContext } from './context.js';
import type { GenerationRequest } from '../core/canonical.js';
import type { GenerationMeta } from '../core/generation.js';
import type { MeteredStream } from '../core/metering.js';
import type { Model } from '../core/model-spec.js';

/** A signal that fires when the client goes away before the reply is complete: generating stops and the slot is freed. */
export function abortOnClientGone(reply: FastifyReply): Cancellation {
  const gone = new Cancellation();
  const res = reply.raw;
  // A client that left while the body was read or the key checked has closed already: no 'close' comes.
  if (res.closed) gone.abort();
  else
    res.once('close', () => {
      if (!res.writableFinished) gone.abort();
    });
  return gone;
}

/** Calls `stop` when the client goes (or now, if it has gone already). */
export function whenGone(gone: Cancellation, stop: () => void): void {
  if (gone.aborted) stop();
  else gone.addEventListener('abort', stop);
}

/**
 * The start every one-shot generation route shares (chat completions, Messages): the pipeline
 * admits the request, the admission's headers go on the reply, and the generation opens. Errors
 * before its first event (overflow, overload, upstream down) are thrown here, so they still get a
 * real status.
 */
export async function openGeneration(
  ctx: RouteContext,
  req: FastifyRequest,
  reply: FastifyReply,
  canonical: GenerationRequest,
  endpoint: GenerationMeta['endpoint'],
): Promise<{ model: Model; events: MeteredStream }> {
  const model = ctx.pipeline.resolve(canonical.model, req.principal!);
  // Labelled before admission, so that a request refused there (429) is counted under its model.
  req.metricsModel = ctx.metrics.modelLabel(model);
  const started = ctx.pipeline.admit(model, canonical, req.principal!, {
    endpoint,
    requestId: req.id,
    stream: canonical.stream,
    started: req.startedAt,
  });
  // Awaited only when it is a promise: admission against local counters is answered at once.
  const { admission, open } = started instanceof Promise ? await started : started;
  reply.headers(admission.headers);
  return { model, events: await open() };
}

/** A failure after a stream's head went out, as the error its protocol renders in the stream; anything unexpected is logged. */
export function streamFailure(err: unknown, log: FastifyBaseLogger): ApiError {
  if (err instanceof ApiError) return err;
  log.error({ err }, 'stream failed');
  return new ApiError('internal_error', 'The stream failed.');
}
