import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { ThinkSplitter, type Piece } from '../src/core/think-splitter.js';
import { StopMatcher } from '../src/core/stop-matcher.js';

/** Feeds text in the given chunks and joins what comes out by kind. */
function split(chunks: string[]): { reasoning: string; text: string } {
  const s = new ThinkSplitter();
  const pieces: Piece[] = [...chunks.flatMap((c) => s.push(c)), ...s.flush()];
  return {
    reasoning: pieces
      .filter((p) => p.kind === 'reasoning')
      .map((p) => p.text)
      .join(''),
    text: pieces
      .filter((p) => p.kind === 'text')
      .map((p) => p.text)
      .join(''),
  };
}

describe('thought segments of local models', () => {
  it('splits <think>…</think> from the answer, whatever the token boundaries', () => {
    const whole = '<think>The user greets me.</think>\n\nHello!';
    const expected = { reasoning: 'The user greets me.', text: 'Hello!' };
    assert.deepEqual(split([whole]), expected);
    assert.deepEqual(split([...whole]), expected, 'one character at a time');
    assert.deepEqual(split(['<th', 'ink>The user ', 'greets me.</', 'think>', '\n\nHel', 'lo!']), expected);
    assert.deepEqual(split(['  <think>a</think>b']), { reasoning: 'a', text: 'b' }, 'leading whitespace is allowed');
  });

  it('passes text without a thought segment through untouched', () => {
    assert.deepEqual(split(['Once upon', ' a time <think> is not a tag here']), {
      reasoning: '',
      text: 'Once upon a time <think> is not a tag here',
    });
    assert.deepEqual(split(['<', 'b>bold']), { reasoning: '', text: '<b>bold' });
    assert.deepEqual(split(['<thi']), { reasoning: '', text: '<thi' }, 'a held partial tag is flushed at the end');
  });

  it('keeps unfinished thinking as reasoning when generation stops inside it', () => {
    assert.deepEqual(split(['<think>still thinking</th']), { reasoning: 'still thinking</th', text: '' });
  });
});

describe('stop sequences across chunk boundaries', () => {
  it('holds back a possible start of a stop string and cuts at the first match', () => {
    const m = new StopMatcher(['END', 'STOP']);
    assert.deepEqual(m.push('abc E'), { emit: 'abc ', stopped: false });
    assert.deepEqual(m.push('N'), { emit: '', stopped: false });
    assert.deepEqual(m.push('X more S'), { emit: 'ENX more ', stopped: false });
    assert.deepEqual(m.push('TOP tail'), { emit: '', stopped: true });
    const n = new StopMatcher(['\n\n']);
    assert.deepEqual(n.push('one\n'), { emit: 'one', stopped: false });
    assert.equal(n.flush(), '\n');
  });
});
