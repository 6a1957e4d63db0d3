import { JinjaTemplateChatWrapper, type ChatHistoryItem, type LlamaModel, type Token } from 'node-llama-cpp';
import type { FunctionTool, Message } from '../../core/canonical.js';
import { TOOL_TRIGGER } from './output.js';

export function textOf(content: Message['content']): string {
  if (content === null) return '';
  if (typeof content === 'string') return content;
  // Several text parts are several blocks of text: one per line, as chat templates join them.
  return content
    .filter((p) => p.type === 'text')
    .map((p) => p.text)
    .join('\n');
}

/**
 * A turn's text as the model sees it: earlier reasoning, when sent back, goes in front of the answer;
 * tool calls are written the way the model is asked to write them; tool results are labelled.
 */
function turnText(m: Message): string {
  let text = textOf(m.content);
  if (m.toolCalls?.length) {
    const calls = m.toolCalls.map(
      (c) => `${TOOL_TRIGGER}${JSON.stringify({ name: c.name, arguments: safeParse(c.arguments) })}</tool_call>`,
    );
    text = [text, ...calls].filter(Boolean).join('\n');
  }
  if (m.role === 'tool') text = `Tool result${m.toolCallId ? ` (${m.toolCallId})` : ''}: ${text}`;
  return m.reasoning ? `${m.reasoning}\n\n${text}` : text;
}

function safeParse(json: string): unknown {
  try {
    return JSON.parse(json);
  } catch {
    return json;
  }
}

/** The functions a model may call, and how to call them, as a system text. */
export function toolsText(tools: readonly FunctionTool[]): string {
  // Compact on purpose: small models have small contexts, and the grammar enforces the exact schema.
  const lines = tools.map((t) => {
    const params = Object.keys((t.parameters?.['properties'] as Record<string, unknown> | undefined) ?? {}).join(', ');
    return `- ${t.name}(${params})${t.description ? `: ${t.description}` : ''}`;
  });
  return `You can call these functions:\n${lines.join('\n')}\nTo call one, answer with ${TOOL_TRIGGER}{"name": "<function>", "arguments": {…}}</tool_call> and nothing else.`;
}

/**
 * How a conversation becomes tokens for one model.
 *
 * - With a chat template (from the GGUF, or configured), the template renders the conversation;
 *   llama.cpp's Jinja support comes from node-llama-cpp's JinjaTemplateChatWrapper.
 * - Without one the model is a base model (TinyStories is one): the message texts are joined with
 *   blank lines, without role markers, so the model continues the text it was given. Role markers it
 *   never saw in training would only push it off its distribution.
 */
export class PromptRenderer {
  private readonly wrapper: JinjaTemplateChatWrapper | undefined;

  constructor(
    private readonly model: LlamaModel,
    template: string | undefined,
  ) {
    this.wrapper = template
      ? new JinjaTemplateChatWrapper({ template, convertUnsupportedSystemMessagesToUserMessages: 'auto' })
      : undefined;
  }

  render(input: readonly Message[], tools: readonly FunctionTool[] = []): Token[] {
    const messages: readonly Message[] = tools.length ? [{ role: 'system', content: toolsText(tools) }, ...input] : input;
    if (!this.wrapper) {
      const text = messages
        .map(turnText)
        .filter((t) => t !== '')
        .join('\n\n');
      const tokens = this.model.tokenize(text);
      const bos = this.model.tokens.bos;
      return bos !== null && this.model.tokens.shouldPrependBosToken ? [bos, ...tokens] : tokens;
    }
    const history: ChatHistoryItem[] = [];
    for (const m of messages) {
      const text = turnText(m);
      if (m.role === 'system' || m.role === 'developer') history.push({ type: 'system', text });
      else if (m.role === 'user') history.push({ type: 'user', text });
      else if (m.role === 'assistant') history.push({ type: 'model', response: [text] });
      else history.push({ type: 'user', text });
    }
    // The open model turn the template appends is where generation starts.
    history.push({ type: 'model', response: [] });
    const { contextText } = this.wrapper.generateContextState({ chatHistory: history });
    return contextText.tokenize(this.model.tokenizer);
  }
}
