import { useEffect, useRef, useState } from 'preact/hooks';
import { isRecord, str, type List } from '../api.js';
import {
  Badge,
  ErrorBanner,
  MoreButton,
  PageHeader,
  RefreshButton,
  errorText,
  useLoad,
  usePaged,
  type PageProps,
  type Paged,
} from '../components.js';
import { formatCost, formatNumber, formatTime } from '../util.js';
import { applyResponse, applyResponsesEvent, responsesUsage, type AssistantTurn } from './playground-wire.js';

type Target = { kind: 'response' | 'conversation' | 'completion'; id: string };

/** Rows per page of each list. */
const PAGE = 20;

function kindOf(id: string): Target['kind'] | null {
  if (id.startsWith('resp_')) return 'response';
  if (id.startsWith('conv_')) return 'conversation';
  if (id.startsWith('chatcmpl')) return 'completion';
  return null;
}

/** The readable part of a stored item (message, tool call, tool output, reasoning). */
function ItemView({ item }: { item: unknown }) {
  if (!isRecord(item)) return null;
  const type = str(item['type']) ?? 'message';
  const parts = Array.isArray(item['content']) ? (item['content'] as unknown[]).filter(isRecord) : [];
  const text =
    typeof item['content'] === 'string'
      ? item['content']
      : parts.map((p) => str(p['text']) ?? str(p['refusal']) ?? `[${str(p['type']) ?? 'part'}]`).join('');
  let label: string;
  let body: string;
  if (type === 'message') {
    label = str(item['role']) ?? 'message';
    body = text;
  } else if (type === 'function_call') {
    label = `tool call ${str(item['name']) ?? ''}`;
    body = str(item['arguments']) ?? '';
  } else if (type === 'function_call_output') {
    label = 'tool result';
    body = typeof item['output'] === 'string' ? item['output'] : JSON.stringify(item['output']);
  } else if (type === 'reasoning') {
    const summary = Array.isArray(item['summary']) ? (item['summary'] as unknown[]).filter(isRecord) : [];
    label = 'reasoning';
    body = [...parts, ...summary].map((p) => str(p['text']) ?? '').join('\n') || '(sealed)';
  } else {
    label = type;
    body = JSON.stringify(item, null, 2);
  }
  return (
    <li class="item">
      <span class="item-label">{label}</span>
      <pre class="wrap">{body}</pre>
    </li>
  );
}

function ResponseView({ api, id }: Pick<PageProps, 'api'> & { id: string }) {
  const loaded = useLoad(
    async (signal) => {
      const [response, items] = await Promise.all([
        api.get<Record<string, unknown>>(`/v1/responses/${encodeURIComponent(id)}`, signal),
        api.get<List<unknown>>(`/v1/responses/${encodeURIComponent(id)}/input_items?order=asc&limit=100`, signal).catch(() => null),
      ]);
      return { response, items };
    },
    [id],
  );
  const [replay, setReplay] = useState<{ turn: AssistantTurn; events: number; done: boolean; error: string | null } | null>(null);
  const stop = useRef<AbortController | null>(null);
  useEffect(() => () => stop.current?.abort(), [id]);

  const startReplay = async () => {
    stop.current?.abort();
    const ctrl = new AbortController();
    stop.current = ctrl;
    const turn: AssistantTurn = {
      role: 'assistant',
      mode: 'responses',
      model: '',
      text: '',
      reasoning: '',
      toolCalls: [],
      usage: null,
      finish: null,
      error: null,
      responseId: id,
      streaming: true,
      ms: null,
    };
    let events = 0;
    setReplay({ turn: { ...turn }, events, done: false, error: null });
    try {
      for await (const ev of api.stream('GET', `/v1/responses/${encodeURIComponent(id)}?stream=true`, undefined, ctrl.signal)) {
        events++;
        try {
          applyResponsesEvent(turn, JSON.parse(ev.data) as unknown);
        } catch {
          // a frame that is not JSON: counted, not shown
        }
        setReplay({ turn: { ...turn }, events, done: false, error: null });
      }
      setReplay({ turn: { ...turn, streaming: false }, events, done: true, error: null });
    } catch (err) {
      setReplay({ turn: { ...turn, streaming: false }, events, done: true, error: errorText(err) });
    }
  };

  if (loaded.error) return <ErrorBanner error={loaded.error} />;
  if (!loaded.data) return <p aria-live="polite">Loading {id}…</p>;
  const r = loaded.data.response;
  const view: AssistantTurn = {
    role: 'assistant',
    mode: 'responses',
    model: str(r['model']) ?? '',
    text: '',
    reasoning: '',
    toolCalls: [],
    usage: null,
    finish: null,
    error: null,
    responseId: id,
    streaming: false,
    ms: null,
  };
  applyResponse(view, r);
  const usage = responsesUsage(r['usage']);
  return (
    <div class="viewer" data-testid="response-view">
      <dl class="inline">
        <dt>Status</dt>
        <dd>
          <Badge tone={r['status'] === 'completed' ? 'good' : r['status'] === 'failed' ? 'bad' : 'warn'}>{String(r['status'])}</Badge>
        </dd>
        <dt>Model</dt>
        <dd>{view.model}</dd>
        <dt>Created</dt>
        <dd>{formatTime(typeof r['created_at'] === 'number' ? r['created_at'] : null)}</dd>
        {usage && (
          <>
            <dt>Usage</dt>
            <dd>
              {formatNumber(usage.input)} in · {formatNumber(usage.output)} out ·{' '}
              {usage.cost === null ? 'not priced' : formatCost(usage.cost)}
            </dd>
          </>
        )}
        {str(r['previous_response_id']) && (
          <>
            <dt>Previous</dt>
            <dd>
              <code>{str(r['previous_response_id'])}</code>
            </dd>
          </>
        )}
      </dl>
      {loaded.data.items && (
        <>
          <h3>Input</h3>
          <ul class="items">
            {loaded.data.items.data.map((item, i) => (
              <ItemView key={i} item={item} />
            ))}
          </ul>
        </>
      )}
      <h3>Output</h3>
      <OutputView turn={view} />
      <div class="row">
        <button type="button" onClick={() => void startReplay()} data-testid="replay-stream">
          Replay the stream
        </button>
      </div>
      {replay && (
        <div class="card replay" aria-live="off">
          <p class="small muted" aria-live="polite">
            {replay.done ? `Replayed ${replay.events} events.` : `Replaying… ${replay.events} events`}
          </p>
          <div data-testid="replay-output" data-done={String(replay.done)}>
            <OutputView turn={replay.turn} />
          </div>
          {replay.error && (
            <p class="error" role="alert">
              {replay.error}
            </p>
          )}
        </div>
      )}
    </div>
  );
}

/** A response's output as the stored view and its replay show it: reasoning, text, tool calls. */
function OutputView({ turn }: { turn: AssistantTurn }) {
  return (
    <>
      {turn.reasoning && (
        <details class="reasoning">
          <summary>Reasoning</summary>
          <pre class="wrap">{turn.reasoning}</pre>
        </details>
      )}
      <div class="answer-text">{turn.text || (turn.streaming ? '' : <span class="muted">(no text)</span>)}</div>
      {turn.toolCalls.map((c) => (
        <div class="tool-call" key={c.id} data-testid="output-tool-call">
          <Badge tone="info">tool call</Badge> <code>{c.name}</code>
          <pre class="wrap">{c.arguments}</pre>
        </div>
      ))}
    </>
  );
}

function ConversationView({ api, id }: Pick<PageProps, 'api'> & { id: string }) {
  const loaded = useLoad(
    async (signal) => {
      const [conversation, items] = await Promise.all([
        api.get<Record<string, unknown>>(`/v1/conversations/${encodeURIComponent(id)}`, signal),
        api.get<List<unknown>>(`/v1/conversations/${encodeURIComponent(id)}/items?order=asc&limit=100`, signal),
      ]);
      return { conversation, items };
    },
    [id],
  );
  if (loaded.error) return <ErrorBanner error={loaded.error} />;
  if (!loaded.data) return <p aria-live="polite">Loading {id}…</p>;
  const c = loaded.data.conversation;
  const metadata = isRecord(c['metadata']) ? Object.entries(c['metadata']) : [];
  return (
    <div class="viewer" data-testid="conversation-view">
      <dl class="inline">
        <dt>Created</dt>
        <dd>{formatTime(typeof c['created_at'] === 'number' ? c['created_at'] : null)}</dd>
        <dt>Metadata</dt>
        <dd>{metadata.length ? metadata.map(([k, v]) => `${k}=${String(v)}`).join(', ') : 'none'}</dd>
      </dl>
      <h3>Items {loaded.data.items.has_more ? '(first 100)' : ''}</h3>
      <ul class="items">
        {loaded.data.items.data.map((item, i) => (
          <ItemView key={i} item={item} />
        ))}
      </ul>
    </div>
  );
}

function CompletionView({ api, id }: Pick<PageProps, 'api'> & { id: string }) {
  const loaded = useLoad(
    async (signal) => {
      const [completion, messages] = await Promise.all([
        api.get<Record<string, unknown>>(`/v1/chat/completions/${encodeURIComponent(id)}`, signal),
        api.get<List<unknown>>(`/v1/chat/completions/${encodeURIComponent(id)}/messages?limit=100`, signal),
      ]);
      return { completion, messages };
    },
    [id],
  );
  if (loaded.error) return <ErrorBanner error={loaded.error} />;
  if (!loaded.data) return <p aria-live="polite">Loading {id}…</p>;
  const c = loaded.data.completion;
  const choices = Array.isArray(c['choices']) ? (c['choices'] as unknown[]) : [];
  const first = choices[0];
  const message = isRecord(first) && isRecord(first['message']) ? first['message'] : {};
  return (
    <div class="viewer" data-testid="completion-view">
      <dl class="inline">
        <dt>Model</dt>
        <dd>{str(c['model'])}</dd>
        <dt>Created</dt>
        <dd>{formatTime(typeof c['created'] === 'number' ? c['created'] : null)}</dd>
      </dl>
      <h3>Messages</h3>
      <ul class="items">
        {loaded.data.messages.data.map((m, i) => (
          <ItemView key={i} item={m} />
        ))}
        <ItemView item={{ ...message, type: 'message' }} />
      </ul>
    </div>
  );
}

type Stored = { id: string } & Record<string, unknown>;

/** The text of a response's output messages, shortened: what a row of the list shows of it. */
function outputPreview(r: Stored): string {
  const output = Array.isArray(r['output']) ? (r['output'] as unknown[]).filter(isRecord) : [];
  const text = output
    .flatMap((item) => {
      if (item['type'] === 'function_call') return [`[tool call ${str(item['name']) ?? ''}]`];
      if (item['type'] !== 'message' || !Array.isArray(item['content'])) return [];
      return (item['content'] as unknown[]).filter(isRecord).map((p) => str(p['text']) ?? str(p['refusal']) ?? '');
    })
    .join(' ')
    .trim();
  return text.length > 120 ? `${text.slice(0, 119)}…` : text;
}

function OpenButton({ id, onOpen }: { id: string; onOpen: () => void }) {
  return (
    <button type="button" class="secondary small" onClick={onOpen}>
      Open<span class="sr-only"> {id}</span>
    </button>
  );
}

function ResponsesList({ list, onOpen }: { list: Paged<Stored>; onOpen: (t: Target) => void }) {
  return (
    <section>
      <h2>Responses</h2>
      <ErrorBanner error={list.error} />
      {list.items.length === 0 && !list.loading && !list.error && (
        <p class="muted">None: responses are stored unless sent with "store": false.</p>
      )}
      {list.items.length > 0 && (
        <div class="table-wrap">
          <table data-testid="stored-responses" aria-busy={list.loading}>
            <thead>
              <tr>
                <th scope="col">Id</th>
                <th scope="col">Status</th>
                <th scope="col">Model</th>
                <th scope="col">Created</th>
                <th scope="col">Output</th>
                <th scope="col">
                  <span class="sr-only">Open</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {list.items.map((r) => {
                const status = str(r['status']) ?? '';
                return (
                  <tr key={r.id} data-testid="stored-response-row" data-id={r.id}>
                    <th scope="row">
                      <code>{r.id}</code>
                    </th>
                    <td>
                      <Badge tone={status === 'completed' ? 'good' : status === 'failed' ? 'bad' : 'warn'}>{status}</Badge>
                    </td>
                    <td>{str(r['model'])}</td>
                    <td class="nowrap">{formatTime(typeof r['created_at'] === 'number' ? r['created_at'] : null)}</td>
                    <td class="clip">{outputPreview(r)}</td>
                    <td>
                      <OpenButton id={r.id} onOpen={() => onOpen({ kind: 'response', id: r.id })} />
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
      <MoreButton list={list} label="responses" testid="stored-responses-more" />
    </section>
  );
}

function ConversationsList({ list, onOpen }: { list: Paged<Stored>; onOpen: (t: Target) => void }) {
  return (
    <section>
      <h2>Conversations</h2>
      <ErrorBanner error={list.error} />
      {list.items.length === 0 && !list.loading && !list.error && <p class="muted">None yet.</p>}
      {list.items.length > 0 && (
        <div class="table-wrap">
          <table data-testid="stored-conversations" aria-busy={list.loading}>
            <thead>
              <tr>
                <th scope="col">Id</th>
                <th scope="col">Created</th>
                <th scope="col">Metadata</th>
                <th scope="col">
                  <span class="sr-only">Open</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {list.items.map((c) => {
                const metadata = isRecord(c['metadata']) ? Object.entries(c['metadata']) : [];
                return (
                  <tr key={c.id} data-testid="stored-conversation-row" data-id={c.id}>
                    <th scope="row">
                      <code>{c.id}</code>
                    </th>
                    <td class="nowrap">{formatTime(typeof c['created_at'] === 'number' ? c['created_at'] : null)}</td>
                    <td class="clip">{metadata.length ? metadata.map(([k, v]) => `${k}=${String(v)}`).join(', ') : '–'}</td>
                    <td>
                      <OpenButton id={c.id} onOpen={() => onOpen({ kind: 'conversation', id: c.id })} />
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
      <MoreButton list={list} label="conversations" testid="stored-conversations-more" />
    </section>
  );
}

function CompletionsList({ list, onOpen }: { list: Paged<Stored>; onOpen: (t: Target) => void }) {
  return (
    <section>
      <h2>Stored chat completions</h2>
      <ErrorBanner error={list.error} />
      {list.items.length === 0 && !list.loading && !list.error && (
        <p class="muted">None: chat completions are stored when sent with "store": true.</p>
      )}
      {list.items.length > 0 && (
        <div class="table-wrap">
          <table data-testid="stored-completions" aria-busy={list.loading}>
            <thead>
              <tr>
                <th scope="col">Id</th>
                <th scope="col">Model</th>
                <th scope="col">Created</th>
                <th scope="col">
                  <span class="sr-only">Open</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {list.items.map((c) => (
                <tr key={c.id}>
                  <th scope="row">
                    <code>{c.id}</code>
                  </th>
                  <td>{str(c['model'])}</td>
                  <td class="nowrap">{formatTime(typeof c['created'] === 'number' ? c['created'] : null)}</td>
                  <td>
                    <OpenButton id={c.id} onOpen={() => onOpen({ kind: 'completion', id: c.id })} />
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      <MoreButton list={list} label="chat completions" testid="stored-completions-more" />
    </section>
  );
}

/**
 * What the signed-in key's organization stored, newest first, from the API's lists (a page at a
 * time): responses, conversations and chat completions; any of them, or an id, opens below the
 * form, and a response's stream can be replayed.
 */
export function Stored({ api, params }: PageProps) {
  const initial = params.get('response') ?? params.get('conversation') ?? params.get('completion');
  const [target, setTarget] = useState<Target | null>(() => {
    if (!initial) return null;
    const kind = kindOf(initial);
    return kind ? { kind, id: initial } : null;
  });
  const [idText, setIdText] = useState('');
  const [idError, setIdError] = useState<string | null>(null);
  const responses = usePaged<Stored>(api, `/v1/responses?order=desc&limit=${PAGE}`);
  const conversations = usePaged<Stored>(api, `/v1/conversations?order=desc&limit=${PAGE}`);
  const completions = usePaged<Stored>(api, `/v1/chat/completions?order=desc&limit=${PAGE}`);
  const viewer = useRef<HTMLHeadingElement>(null);

  const open = (t: Target) => {
    setTarget(t);
    showInAddress(t);
    requestAnimationFrame(() => viewer.current?.focus());
  };

  return (
    <section>
      <PageHeader title="Stored responses and conversations">
        <RefreshButton
          testId="stored-refresh"
          onClick={() => {
            responses.reload();
            conversations.reload();
            completions.reload();
          }}
        />
      </PageHeader>
      <form
        class="filters"
        onSubmit={(e) => {
          e.preventDefault();
          const id = idText.trim();
          const kind = kindOf(id);
          if (!kind) {
            setIdError('Ids start with resp_, conv_ or chatcmpl.');
            return;
          }
          setIdError(null);
          open({ kind, id });
        }}
      >
        <div class="field grow">
          <label for="stored-id">Open by id</label>
          <input
            id="stored-id"
            value={idText}
            placeholder="resp_…, conv_… or chatcmpl-…"
            aria-invalid={idError !== null}
            aria-describedby={idError !== null ? 'stored-id-error' : undefined}
            onInput={(e) => setIdText(e.currentTarget.value)}
            data-testid="stored-id"
          />
          {idError !== null && (
            <p id="stored-id-error" class="small error-text">
              {idError}
            </p>
          )}
        </div>
        <div class="field">
          <button type="submit" data-testid="stored-open">
            Open
          </button>
        </div>
      </form>

      {target && (
        <section class="card" aria-labelledby="viewer-title">
          <h2 id="viewer-title" ref={viewer} tabIndex={-1}>
            {target.kind === 'response' ? 'Response' : target.kind === 'conversation' ? 'Conversation' : 'Chat completion'}{' '}
            <code>{target.id}</code>
          </h2>
          {target.kind === 'response' ? (
            <ResponseView key={target.id} api={api} id={target.id} />
          ) : target.kind === 'conversation' ? (
            <ConversationView key={target.id} api={api} id={target.id} />
          ) : (
            <CompletionView key={target.id} api={api} id={target.id} />
          )}
        </section>
      )}

      <p class="small muted">Everything your organization stored, newest first; every key of the organization sees the same lists.</p>
      <ResponsesList list={responses} onOpen={open} />
      <ConversationsList list={conversations} onOpen={open} />
      <CompletionsList list={completions} onOpen={open} />
    </section>
  );
}

/** Keeps the open item in the address (ids only, never the key), so it can be reloaded or shared. */
function showInAddress(t: Target): void {
  history.replaceState(null, '', `/console/stored?${t.kind}=${encodeURIComponent(t.id)}`);
}
