// Answers as Markdown: markdown-it builds the HTML with raw HTML switched off (so any markup in
// the model's text is escaped and shows as text), DOMPurify checks the result again, and links
// may only point at http(s)/mailto or this site. Code in a fence that names a language
// highlight.js knows is highlighted (its HTML is escaped text in <span class="hljs-...">, checked
// by DOMPurify with the rest); math (markdown-math.js) is drawn by KaTeX after the check, from
// the text DOMPurify let through, with KaTeX's DOM API (inline styles set through CSSOM, which
// the strict CSP allows) and without trust (no \href, \htmlClass...). Exposes window.ChatMarkdown.
(() => {
  'use strict';

  const md = window.markdownit({ html: false, linkify: true, typographer: false });
  // Images would load a URL the model chose (a tracking pixel at best): show them as links.
  md.disable('image');
  if (window.ChatMarkdownMath) md.use(window.ChatMarkdownMath);

  const SAFE_URL = /^(?:https?:|mailto:|[^a-z]|[a-z+.-]+(?:[^a-z+.\-:]|$))/i;
  const baseValidate = md.validateLink.bind(md);
  // markdown-it already refuses javascript:, vbscript: and file:; data: URLs go too.
  md.validateLink = (url) => baseValidate(url) && !/^\s*data:/i.test(url) && SAFE_URL.test(url.trim());

  const escape = md.utils.escapeHtml;

  // highlight.js's HTML for a language it knows (its common bundle), else the code escaped.
  function highlighted(code, lang) {
    const hljs = window.hljs;
    if (!lang || !hljs?.getLanguage(lang)) return escape(code);
    try {
      return hljs.highlight(code, { language: lang, ignoreIllegals: true }).value;
    } catch {
      return escape(code);
    }
  }

  md.renderer.rules.fence = (tokens, idx) => {
    const token = tokens[idx];
    const lang = (token.info || '').trim().split(/\s+/)[0].replace(/[^\w+#.-]/g, '').slice(0, 30);
    const known = Boolean(lang && window.hljs?.getLanguage(lang));
    // `hljs` gives the block its theme's background, the one its colours are contrasted with.
    const langClass = lang ? ` class="language-${escape(lang)}${known ? ' hljs' : ''}"` : '';
    return (
      '<div class="code-block">' +
      `<div class="code-head"><span class="code-lang">${escape(lang || 'text')}</span>` +
      '<button type="button" class="copy-code" aria-label="Copy code">Copy</button></div>' +
      `<pre><code${langClass}>${highlighted(token.content, lang)}</code></pre></div>\n`
    );
  };
  md.renderer.rules.code_block = md.renderer.rules.fence;

  const PURIFY = {
    ALLOWED_TAGS: [
      'a', 'p', 'br', 'hr', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'ul', 'ol', 'li', 'blockquote',
      'strong', 'em', 's', 'code', 'pre', 'table', 'thead', 'tbody', 'tr', 'th', 'td',
      'div', 'span', 'button',
    ],
    ALLOWED_ATTR: ['href', 'title', 'class', 'type', 'aria-label', 'start', 'style'],
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|[^a-z]|[a-z+.-]+(?:[^a-z+.\-:]|$))/i,
    RETURN_DOM_FRAGMENT: true,
  };

  window.DOMPurify.addHook('afterSanitizeAttributes', (node) => {
    if (node.tagName === 'A') {
      node.setAttribute('target', '_blank');
      node.setAttribute('rel', 'noopener noreferrer');
    }
    // Only markdown-it's table alignment may style anything.
    if (node.hasAttribute('style') && !/^text-align:(left|right|center)$/.test(node.getAttribute('style'))) {
      node.removeAttribute('style');
    }
  });

  const KATEX = {
    // Thrown, not drawn: KaTeX would colour its error with a style attribute, which the CSP
    // refuses; drawMath marks it with a class instead.
    throwOnError: true,
    trust: false,
    strict: 'ignore',
    maxSize: 50,
    maxExpand: 500,
    output: 'htmlAndMathml', // MathML for screen readers, HTML for the eye
  };

  function drawMath(root) {
    const katex = window.katex;
    if (!katex) return;
    for (const node of root.querySelectorAll('.math')) {
      const tex = node.textContent;
      try {
        katex.render(tex, node, { ...KATEX, displayMode: node.classList.contains('math-display') });
      } catch (error) {
        // The TeX as it was written (still partial while an answer streams), marked.
        node.textContent = tex;
        node.classList.add('math-error');
        node.title = String(error?.message || error).slice(0, 300);
      }
    }
  }

  // A DocumentFragment of the rendered, sanitised Markdown.
  function render(text) {
    const fragment = window.DOMPurify.sanitize(md.render(text || ''), PURIFY);
    drawMath(fragment);
    return fragment;
  }

  window.ChatMarkdown = { render };
})();
