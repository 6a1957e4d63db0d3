import { errors as undiciErrors, type buildConnector } from 'undici';

/**
 * What undici's abort of a running call is turned into: a socket error. One shared instance, since
 * it is never shown to anyone (the call it ends was aborted already) and making an error captures a
 * stack trace.
 */
const CALL_ABORTED = new undiciErrors.SocketError('the call on this connection was aborted');

/** undici's note for a call it aborts (client-h1's `abort`), the one error whose socket close puts the call back. */
const abortNote = (err: Error | undefined): boolean => err instanceof undiciErrors.InformationalError && err.message === 'aborted';

/**
 * Wraps an undici connector so that an aborted call does not open a new connection.
 *
 * undici 7 aborts a running call by destroying its socket with an informational error. When the
 * socket closes, the client puts the aborted request back as pending (informational errors mean
 * "retry elsewhere"), opens a new connection for it, and only there finds it aborted
 * (nodejs/undici#5845; the fix is in undici 8, which needs Node 22). For a gateway every client that
 * goes away mid-stream, and every output limit or timeout, cost a TCP connect on the event loop and
 * left an idle connection open on the upstream: 5,000 streams closed at once reopened 5,000
 * connections (bench/README.md, "Streams closed at once").
 *
 * The sockets this connector hands to undici turn that one error into a socket error. undici
 * treats a socket error as the end of the running request (it is not put back) and, as with an
 * informational one, does not fail requests still waiting for the connection, which get a new one
 * as before.
 */
export function withoutReconnectAfterAbort(inner: buildConnector.connector): buildConnector.connector {
  return (opts, callback) => {
    inner(opts, (...args) => {
      const socket = args[1];
      if (socket) {
        // The socket's own destroy (an inner connector may have set one), with the note replaced.
        const destroy = socket.destroy;
        socket.destroy = function (this: typeof socket, err?: Error) {
          return destroy.call(this, abortNote(err) ? CALL_ABORTED : err);
        };
      }
      callback(...args);
    });
  };
}
