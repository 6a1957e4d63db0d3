import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { isRecord, type List, type Model } from '../api.js';
import { CopyButton, ErrorBanner, PageHeader, errorText, useLoad, type PageProps } from '../components.js';
import { formatCost, formatNumber, parseJson } from '../util.js';
import {
  EXAMPLE_SCHEMA,
  EXAMPLE_TOOLS,
  applyChatChunk,
  applyChatCompletion,
  applyResponse,
  applyResponsesEvent,
  checkTools,
  codeFor,
  requestOf,
  type AssistantTurn,
  type Mode,
  type Settings,
  type ToolCall,
  type Turn,
} from './playground-wire.js';

function UsageLine({ turn }: { turn: AssistantTurn }) {
  const u = turn.usage;
  const parts: string[] = [];
  if (u) {
    parts.push(`${formatNumber(u.input)} in${u.cached ? ` (${formatNumber(u.cached)} cached)` : ''}`);
    parts.push(`${formatNumber(u.output)} out${u.reasoning ? ` (${formatNumber(u.reasoning)} reasoning)` : ''}`);
    parts.push(u.cost === null ? 'cost unknown (not priced)' : `cost ${formatCost(u.cost)}`);
    if (u.estimated) parts.push('estimated');
  }
  if (turn.finish) parts.push(`finish: ${turn.finish}`);
  if (turn.ms !== null) parts.push(`${(turn.ms / 1000).toFixed(2)} s`);
  if (parts.length === 0) return null;
  return (
    <p class="usage-line small muted" data-testid="answer-usage">
      {parts.join(' · ')}
      {turn.responseId && (
        <>
          {' · '}
          <a href={`/console/stored?response=${encodeURIComponent(turn.responseId)}`}>
            <code>{turn.responseId}</code>
          </a>
        </>
      )}
    </p>
  );
}

function Answer({ turn }: { turn: AssistantTurn }) {
  return (
    <article class="turn turn-assistant" aria-label="Answer" data-testid="answer">
      <header class="turn-role">
        Assistant <span class="muted small">{turn.model}</span>
      </header>
      {turn.reasoning !== '' && (
        <details class="reasoning" open={turn.streaming && turn.text === ''} data-testid="answer-reasoning">
          <summary>Reasoning</summary>
          <pre class="wrap">{turn.reasoning}</pre>
        </details>
      )}
      <div class="answer-text" data-testid="answer-text">
        {turn.text}
        {turn.streaming && <span class="cursor" aria-hidden="true" />}
      </div>
      {turn.toolCalls.map((c) => (
        <div class="tool-call" key={c.id}>
          <span class="badge badge-info">tool call</span> <code>{c.name}</code> <span class="muted small">{c.id}</span>
          <pre class="wrap">{c.arguments}</pre>
        </div>
      ))}
      {turn.error !== null && (
        <p class="error" role="alert">
          {turn.error}
        </p>
      )}
      <UsageLine turn={turn} />
    </article>
  );
}

function ToolResults({ calls, onSend, disabled }: { calls: ToolCall[]; onSend: (outputs: string[]) => void; disabled: boolean }) {
  const [outputs, setOutputs] = useState(() => calls.map(() => ''));
  return (
    <form
      class="card tool-results"
      onSubmit={(e) => {
        e.preventDefault();
        onSend(outputs);
      }}
      aria-label="Tool results"
    >
      <h2 class="h3">Tool results</h2>
      <p class="small muted">Run the calls yourself and send back what they returned; the model continues from there.</p>
      {calls.map((c, i) => (
        <div class="field" key={c.id}>
          <label for={`tool-result-${i}`}>
            Result of <code>{c.name}</code> <span class="muted small">({c.id})</span>
          </label>
          <textarea
            id={`tool-result-${i}`}
            rows={3}
            class="mono"
            data-testid="tool-result"
            value={outputs[i] ?? ''}
            placeholder='{"temperature": 21, "unit": "celsius"}'
            onInput={(e) => {
              const v = e.currentTarget.value;
              setOutputs((o) => o.map((x, j) => (j === i ? v : x)));
            }}
          />
        </div>
      ))}
      <button type="submit" disabled={disabled} data-testid="tool-result-send">
        Send tool results
      </button>
    </form>
  );
}

function CodeView({ path, body }: { path: string; body: Record<string, unknown> }) {
  const [tab, setTab] = useState<'curl' | 'js' | 'python'>('curl');
  const code = codeFor(path, body, location.origin);
  const tabs = [
    ['curl', 'curl'],
    ['js', 'JavaScript (openai)'],
    ['python', 'Python (openai)'],
  ] as const;
  return (
    <section class="card code-view" aria-label="Equivalent code" data-testid="playground-code">
      <div role="tablist" aria-label="Language" class="tabs">
        {tabs.map(([id, label]) => (
          <button
            key={id}
            type="button"
            role="tab"
            id={`code-tab-${id}`}
            aria-selected={tab === id}
            aria-controls="code-panel"
            tabIndex={tab === id ? 0 : -1}
            class={tab === id ? 'tab active' : 'tab'}
            onClick={() => setTab(id)}
            onKeyDown={(e) => {
              if (e.key !== 'ArrowRight' && e.key !== 'ArrowLeft') return;
              const i = tabs.findIndex(([t]) => t === tab);
              const next = tabs[(i + (e.key === 'ArrowRight' ? 1 : tabs.length - 1)) % tabs.length];
              if (next) {
                setTab(next[0]);
                document.getElementById(`code-tab-${next[0]}`)?.focus();
              }
            }}
          >
            {label}
          </button>
        ))}
      </div>
      <div id="code-panel" role="tabpanel" aria-labelledby={`code-tab-${tab}`}>
        <pre class="code">
          <code>{code[tab]}</code>
        </pre>
        <CopyButton text={code[tab]} label="Copy code" />
        <p class="small muted">The key is read from the SWITCHYARD_API_KEY environment variable; the console never shows it.</p>
      </div>
    </section>
  );
}

function newAnswer(mode: Mode, model: string): AssistantTurn {
  return {
    role: 'assistant',
    mode,
    model,
    text: '',
    reasoning: '',
    toolCalls: [],
    usage: null,
    finish: null,
    error: null,
    responseId: null,
    streaming: true,
    ms: null,
  };
}

export function Playground({ api, params }: PageProps) {
  const models = useLoad(async (signal) => (await api.get<List<Model>>('/v1/models?type=text_generation', signal)).data, []);
  const [model, setModel] = useState(params.get('model') ?? '');
  const [mode, setMode] = useState<Mode>('chat');
  const [system, setSystem] = useState('');
  const [temperature, setTemperature] = useState('');
  const [topP, setTopP] = useState('');
  const [maxTokens, setMaxTokens] = useState('256');
  /** Whether the user set max tokens; until then it follows the model (a quarter of its context, at most 256). */
  const [maxTouched, setMaxTouched] = useState(false);
  const [stream, setStream] = useState(true);
  const [toolsOn, setToolsOn] = useState(false);
  const [toolsText, setToolsText] = useState(EXAMPLE_TOOLS);
  const [toolChoice, setToolChoice] = useState<'auto' | 'none' | 'required'>('auto');
  const [schemaOn, setSchemaOn] = useState(false);
  const [schemaName, setSchemaName] = useState('story');
  const [schemaText, setSchemaText] = useState(EXAMPLE_SCHEMA);
  const [useConversation, setUseConversation] = useState(false);
  const [conversationId, setConversationId] = useState<string | null>(null);
  const [turns, setTurns] = useState<Turn[]>([]);
  const [input, setInput] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [showCode, setShowCode] = useState(false);
  const abort = useRef<AbortController | null>(null);
  const transcriptEnd = useRef<HTMLDivElement>(null);

  // Pick a model that can generate once the list is in (the one asked for in the URL if any), unless
  // one was picked meanwhile.
  useEffect(() => {
    const list = models.data;
    if (!list) return;
    const first = list.find((m) => m.available) ?? list[0];
    setModel((current) => (list.some((m) => m.id === current) ? current : (first?.id ?? '')));
  }, [models.data]);

  // 256 tokens of a 512-token context left the second turn no room (context_length_exceeded).
  useEffect(() => {
    const ctx = models.data?.find((m) => m.id === model)?.context_length;
    if (!maxTouched && ctx !== undefined) setMaxTokens(String(Math.max(16, Math.min(256, Math.floor(ctx / 4)))));
  }, [model, models.data, maxTouched]);

  useEffect(() => () => abort.current?.abort(), []);

  const tools = useMemo(() => parseJson(toolsText), [toolsText]);
  const toolsError = !toolsOn ? null : 'error' in tools ? `Tools: ${tools.error}` : checkTools(tools.value);
  const schema = useMemo(() => parseJson(schemaText), [schemaText]);
  const schemaError = !schemaOn
    ? null
    : 'error' in schema
      ? `Schema: ${schema.error}`
      : isRecord(schema.value)
        ? null
        : 'The schema must be a JSON object.';

  const settings = (): Settings => ({
    model,
    mode,
    system,
    temperature,
    topP,
    maxTokens,
    stream,
    toolsOn,
    tools: toolsOn && 'value' in tools && Array.isArray(tools.value) ? (tools.value as unknown[]) : [],
    toolChoice,
    schemaOn,
    schemaName,
    schema: 'value' in schema ? schema.value : {},
    conversationId: mode === 'responses' && useConversation ? conversationId : null,
  });

  const lastAnswer = [...turns].reverse().find((t): t is AssistantTurn => t.role === 'assistant');
  const pendingCalls =
    turns.length > 0 && turns[turns.length - 1] === lastAnswer && lastAnswer && !lastAnswer.streaming ? lastAnswer.toolCalls : [];

  // The request the next send would make, for "show code".
  let preview: { path: string; body: Record<string, unknown> } | null = null;
  if (showCode) {
    try {
      const next: Turn[] = input.trim() !== '' ? [...turns, { role: 'user', text: input }] : turns;
      preview = requestOf(settings(), next.length ? next : [{ role: 'user', text: 'Once upon a time' }]);
    } catch {
      preview = null;
    }
  }

  /** What stops a request from being sent (checked before the input is taken). */
  const problem = (): string | null => toolsError ?? schemaError ?? (model === '' ? 'Pick a model first.' : null);

  const run = async (history: Turn[]) => {
    setError(null);
    setBusy(true);
    const ctrl = new AbortController();
    abort.current = ctrl;
    const s = settings();
    const answer = newAnswer(s.mode, s.model);
    const started = performance.now();
    const show = () => setTurns([...history, { ...answer }]);
    show();
    try {
      // A conversation kept on the server is created before its first turn.
      if (s.mode === 'responses' && useConversation && s.conversationId === null) {
        const conv = await api.request<{ id: string }>('POST', '/v1/conversations', {}, ctrl.signal);
        s.conversationId = conv.id;
        setConversationId(conv.id);
      }
      const { path, body } = requestOf(s, history);
      if (s.stream) {
        const calls = new Map<number, ToolCall>();
        for await (const ev of api.stream('POST', path, body, ctrl.signal)) {
          if (ev.data === '[DONE]') break;
          const parsed = parseJson(ev.data);
          if (!('value' in parsed)) continue;
          if (ev.event === 'json') {
            if (s.mode === 'chat') applyChatCompletion(answer, parsed.value);
            else applyResponse(answer, parsed.value);
          } else if (s.mode === 'chat') applyChatChunk(answer, parsed.value, calls);
          else applyResponsesEvent(answer, parsed.value);
          show();
        }
      } else {
        const result = await api.request<unknown>('POST', path, body, ctrl.signal);
        if (s.mode === 'chat') applyChatCompletion(answer, result);
        else applyResponse(answer, result);
      }
    } catch (err) {
      if (ctrl.signal.aborted) answer.finish = 'stopped';
      else answer.error = errorText(err);
    } finally {
      answer.streaming = false;
      answer.ms = performance.now() - started;
      show();
      setBusy(false);
      abort.current = null;
    }
  };

  const send = (e?: Event) => {
    e?.preventDefault();
    if (busy || input.trim() === '') return;
    const stop = problem();
    if (stop) {
      setError(new Error(stop));
      return;
    }
    const history: Turn[] = [...turns, { role: 'user', text: input }];
    setInput('');
    void run(history);
  };

  const sendToolResults = (outputs: string[]) => {
    const stop = problem();
    if (stop) {
      setError(new Error(stop));
      return;
    }
    const history: Turn[] = [
      ...turns,
      ...pendingCalls.map((c, i): Turn => ({ role: 'tool', callId: c.id, name: c.name, output: outputs[i] ?? '' })),
    ];
    void run(history);
  };

  useEffect(() => transcriptEnd.current?.scrollIntoView({ block: 'nearest' }), [turns]);

  const streaming = busy && lastAnswer?.streaming === true;
  const selected = models.data?.find((m) => m.id === model);

  return (
    <section class="playground">
      <PageHeader title="Playground">
        <button
          type="button"
          class="secondary"
          aria-expanded={showCode}
          aria-controls="playground-code"
          onClick={() => setShowCode(!showCode)}
          data-testid="show-code"
        >
          {showCode ? 'Hide code' : 'Show code'}
        </button>
        <button
          type="button"
          class="secondary"
          disabled={busy || turns.length === 0}
          onClick={() => {
            setTurns([]);
            setConversationId(null);
            setError(null);
          }}
        >
          New chat
        </button>
      </PageHeader>
      <div class="playground-grid">
        <form class="card settings" aria-label="Request settings" onSubmit={(e) => e.preventDefault()}>
          <div class="field">
            <label for="pg-model">Model</label>
            <select
              id="pg-model"
              value={model}
              onChange={(e) => setModel(e.currentTarget.value)}
              data-testid="playground-model"
              disabled={!models.data}
            >
              {(models.data ?? []).map((m) => (
                <option key={m.id} value={m.id}>
                  {m.id}
                  {m.available ? '' : ' (no deployment)'}
                </option>
              ))}
            </select>
            {selected && !selected.available && (
              <p class="small warn-text">No local file or deployment serves this model: requests answer 503.</p>
            )}
            {selected && (
              <p class="small muted">
                {selected.context_length !== undefined ? `${formatNumber(selected.context_length)} tokens of context · ` : ''}
                {selected.capabilities.join(', ')}
              </p>
            )}
          </div>
          <fieldset class="field">
            <legend>API</legend>
            <div class="radio-row">
              <label>
                <input
                  type="radio"
                  name="pg-mode"
                  value="chat"
                  checked={mode === 'chat'}
                  onChange={() => setMode('chat')}
                  data-testid="playground-mode-chat"
                />{' '}
                Chat completions
              </label>
              <label>
                <input
                  type="radio"
                  name="pg-mode"
                  value="responses"
                  checked={mode === 'responses'}
                  onChange={() => setMode('responses')}
                  data-testid="playground-mode-responses"
                />{' '}
                Responses
              </label>
            </div>
          </fieldset>
          {mode === 'responses' && (
            <div class="field checkbox">
              <input
                id="pg-conv"
                type="checkbox"
                checked={useConversation}
                disabled={turns.length > 0}
                onChange={(e) => setUseConversation(e.currentTarget.checked)}
              />
              <label for="pg-conv">Keep the turns in a stored conversation{conversationId ? ` (${conversationId})` : ''}</label>
            </div>
          )}
          <div class="field">
            <label for="pg-system">{mode === 'chat' ? 'System prompt' : 'Instructions'}</label>
            <textarea
              id="pg-system"
              rows={3}
              value={system}
              onInput={(e) => setSystem(e.currentTarget.value)}
              placeholder="You are a helpful assistant."
            />
          </div>
          <div class="param-row">
            <div class="field">
              <label for="pg-temp">Temperature</label>
              <input
                id="pg-temp"
                type="number"
                min="0"
                max="2"
                step="0.1"
                inputMode="decimal"
                value={temperature}
                placeholder="default"
                onInput={(e) => setTemperature(e.currentTarget.value)}
              />
            </div>
            <div class="field">
              <label for="pg-topp">top_p</label>
              <input
                id="pg-topp"
                type="number"
                min="0"
                max="1"
                step="0.05"
                inputMode="decimal"
                value={topP}
                placeholder="default"
                onInput={(e) => setTopP(e.currentTarget.value)}
              />
            </div>
            <div class="field">
              <label for="pg-max">Max tokens</label>
              <input
                id="pg-max"
                type="number"
                min="1"
                step="1"
                inputMode="numeric"
                value={maxTokens}
                placeholder="default"
                onInput={(e) => {
                  setMaxTouched(true);
                  setMaxTokens(e.currentTarget.value);
                }}
                data-testid="playground-max-tokens"
              />
            </div>
          </div>
          <div class="field checkbox">
            <input id="pg-stream" type="checkbox" checked={stream} onChange={(e) => setStream(e.currentTarget.checked)} />
            <label for="pg-stream">Stream token by token</label>
          </div>
          <div class="field checkbox">
            <input
              id="pg-tools"
              type="checkbox"
              checked={toolsOn}
              onChange={(e) => setToolsOn(e.currentTarget.checked)}
              data-testid="playground-tools-on"
            />
            <label for="pg-tools">Function tools</label>
          </div>
          {toolsOn && (
            <>
              <div class="field">
                <label for="pg-tools-json">Tools (JSON: chat or Responses form)</label>
                <textarea
                  id="pg-tools-json"
                  class="mono"
                  rows={10}
                  spellcheck={false}
                  value={toolsText}
                  aria-invalid={toolsError !== null}
                  aria-describedby="pg-tools-error"
                  onInput={(e) => setToolsText(e.currentTarget.value)}
                  data-testid="playground-tools"
                />
                <p id="pg-tools-error" class={toolsError ? 'small error-text' : 'small muted'}>
                  {toolsError ?? 'Valid JSON.'}{' '}
                </p>
                {'value' in tools && (
                  <button type="button" class="secondary small" onClick={() => setToolsText(JSON.stringify(tools.value, null, 2))}>
                    Format JSON
                  </button>
                )}
              </div>
              <div class="field">
                <label for="pg-tool-choice">Tool choice</label>
                <select
                  id="pg-tool-choice"
                  value={toolChoice}
                  onChange={(e) => setToolChoice(e.currentTarget.value as 'auto' | 'none' | 'required')}
                  data-testid="playground-tool-choice"
                >
                  <option value="auto">auto</option>
                  <option value="required">required</option>
                  <option value="none">none</option>
                </select>
              </div>
            </>
          )}
          <div class="field checkbox">
            <input
              id="pg-schema"
              type="checkbox"
              checked={schemaOn}
              onChange={(e) => setSchemaOn(e.currentTarget.checked)}
              data-testid="playground-schema-on"
            />
            <label for="pg-schema">Structured output (json_schema)</label>
          </div>
          {schemaOn && (
            <>
              <div class="field">
                <label for="pg-schema-name">Schema name</label>
                <input
                  id="pg-schema-name"
                  value={schemaName}
                  pattern="[A-Za-z0-9_-]{1,64}"
                  onInput={(e) => setSchemaName(e.currentTarget.value)}
                />
              </div>
              <div class="field">
                <label for="pg-schema-json">JSON schema</label>
                <textarea
                  id="pg-schema-json"
                  class="mono"
                  rows={10}
                  spellcheck={false}
                  value={schemaText}
                  aria-invalid={schemaError !== null}
                  aria-describedby="pg-schema-error"
                  onInput={(e) => setSchemaText(e.currentTarget.value)}
                />
                <p id="pg-schema-error" class={schemaError ? 'small error-text' : 'small muted'}>
                  {schemaError ?? 'Valid JSON.'}
                </p>
              </div>
            </>
          )}
        </form>
        <div class="chat">
          {showCode && preview && (
            <div id="playground-code">
              <CodeView path={preview.path} body={preview.body} />
            </div>
          )}
          <ErrorBanner error={models.error ?? error} />
          <div
            class="transcript card"
            data-testid="playground-output"
            data-streaming={streaming ? 'true' : 'false'}
            aria-busy={streaming}
            aria-label="Conversation"
            role="log"
          >
            {turns.length === 0 && <p class="muted">Write a message below and send it; the answer streams here.</p>}
            {turns.map((t, i) =>
              t.role === 'assistant' ? (
                <Answer key={i} turn={t} />
              ) : t.role === 'user' ? (
                <article key={i} class="turn turn-user" aria-label="Your message">
                  <header class="turn-role">You</header>
                  <div class="wrap">{t.text}</div>
                </article>
              ) : (
                <article key={i} class="turn turn-tool" aria-label="Tool result">
                  <header class="turn-role">
                    Tool result <code>{t.name}</code> <span class="muted small">{t.callId}</span>
                  </header>
                  <pre class="wrap">{t.output}</pre>
                </article>
              ),
            )}
            <div ref={transcriptEnd} />
          </div>
          {pendingCalls.length > 0 && (
            <ToolResults key={lastAnswer?.responseId ?? turns.length} calls={pendingCalls} onSend={sendToolResults} disabled={busy} />
          )}
          <form class="composer" onSubmit={send}>
            <label for="pg-input" class="sr-only">
              Message
            </label>
            <textarea
              id="pg-input"
              rows={3}
              value={input}
              placeholder="Once upon a time"
              onInput={(e) => setInput(e.currentTarget.value)}
              onKeyDown={(e) => {
                if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) send(e);
              }}
              aria-describedby="pg-input-help"
              data-testid="playground-input"
            />
            <div class="composer-actions">
              <span id="pg-input-help" class="small muted">
                Ctrl+Enter sends
              </span>
              {busy ? (
                <button type="button" class="danger" onClick={() => abort.current?.abort()} data-testid="playground-stop">
                  Stop
                </button>
              ) : null}
              <button type="submit" disabled={busy || input.trim() === '' || model === ''} data-testid="playground-send">
                Send
              </button>
            </div>
          </form>
        </div>
      </div>
    </section>
  );
}
