// Math in answers, as a markdown-it plugin: $...$ and \(...\) inline, $$...$$ and \[...\] for
// display (on their own lines or inline). The TeX is kept as escaped text in a
// <span class="math"> or <div class="math">; markdown.js has KaTeX draw it after DOMPurify's
// check. A lone $ (prices: "$5 and $10") stays text: an inline $ must not open on a space nor
// close after one or before a digit, as Pandoc reads it. Exposes window.ChatMarkdownMath.
(() => {
  'use strict';

  const DELIMITERS = [
    { open: '$$', close: '$$', display: true },
    { open: '\\[', close: '\\]', display: true },
    { open: '\\(', close: '\\)', display: false },
    { open: '$', close: '$', display: false },
  ];

  const isSpace = (ch) => ch === ' ' || ch === '\t' || ch === '\n';
  const isDigit = (ch) => ch >= '0' && ch <= '9';

  // The end of a lone-$ span starting at `from`, or -1.
  function dollarEnd(src, from, max) {
    if (from >= max || isSpace(src[from])) return -1;
    for (let at = src.indexOf('$', from); at !== -1 && at < max; at = src.indexOf('$', at + 1)) {
      if (src[at - 1] === '\\') continue;
      if (isSpace(src[at - 1]) || isDigit(src[at + 1] || '')) continue;
      return at;
    }
    return -1;
  }

  function mathInline(state, silent) {
    const { src, pos, posMax } = state;
    if (src[pos] !== '$' && src[pos] !== '\\') return false;
    for (const { open, close, display } of DELIMITERS) {
      if (!src.startsWith(open, pos)) continue;
      const from = pos + open.length;
      const end = open === '$' ? dollarEnd(src, from, posMax) : src.indexOf(close, from);
      if (end === -1 || end + close.length > posMax) return false;
      const content = src.slice(from, end);
      if (!content.trim() || /\n\s*\n/.test(content)) return false;
      if (!silent) {
        const token = state.push('math_inline', 'span', 0);
        token.content = content;
        token.markup = open;
        token.meta = { display };
      }
      state.pos = end + close.length;
      return true;
    }
    return false;
  }

  // $$ or \[ opening a line, closed on that line's end or a later line's end.
  function mathBlock(state, startLine, endLine, silent) {
    if (state.sCount[startLine] - state.blkIndent >= 4) return false;
    const lineText = (line) => state.src.slice(state.bMarks[line] + state.tShift[line], state.eMarks[line]);
    const first = lineText(startLine);
    const delimiter = DELIMITERS.find((d) => d.display && first.startsWith(d.open));
    if (!delimiter) return false;
    const { open, close } = delimiter;
    const rest = first.slice(open.length);
    const closedAt = rest.indexOf(close);
    // "$$a$$ and more" is a paragraph with inline display math.
    if (closedAt !== -1 && rest.slice(closedAt + close.length).trim()) return false;
    const lines = [];
    let last = startLine;
    if (closedAt !== -1) lines.push(rest.slice(0, closedAt));
    else {
      lines.push(rest);
      for (last = startLine + 1; last < endLine; last += 1) {
        if (state.sCount[last] < state.blkIndent) return false;
        const text = lineText(last).trimEnd();
        if (text.endsWith(close)) { lines.push(text.slice(0, -close.length)); break; }
        lines.push(text);
      }
      if (last >= endLine) return false; // not closed (yet, while streaming): left as text
    }
    const content = lines.join('\n');
    if (!content.trim()) return false;
    if (silent) return true;
    const token = state.push('math_block', 'div', 0);
    token.block = true;
    token.content = content;
    token.markup = open;
    token.map = [startLine, last + 1];
    state.line = last + 1;
    return true;
  }

  function plugin(md) {
    const escape = md.utils.escapeHtml;
    // Before `escape`, which would read \( and \[ as escaped brackets.
    md.inline.ruler.before('escape', 'math_inline', mathInline);
    md.block.ruler.before('fence', 'math_block', mathBlock, { alt: ['paragraph', 'reference', 'blockquote', 'list'] });
    md.renderer.rules.math_inline = (tokens, idx) => {
      const kind = tokens[idx].meta.display ? 'math-display' : 'math-inline';
      return `<span class="math ${kind}">${escape(tokens[idx].content)}</span>`;
    };
    md.renderer.rules.math_block = (tokens, idx) => `<div class="math math-display">${escape(tokens[idx].content)}</div>\n`;
  }

  window.ChatMarkdownMath = plugin;
})();
