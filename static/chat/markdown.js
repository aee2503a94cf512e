// Answers as Markdown: markdown-it builds the HTML with raw HTML switched off (so any markup in
// the model's text is escaped and shows as text), DOMPurify checks the result again, and links
// may only point at http(s)/mailto or this site. Exposes window.ChatMarkdown.
(() => {
  'use strict';

  const md = window.markdownit({ html: false, linkify: true, typographer: false });
  // Images would load a URL the model chose (a tracking pixel at best): show them as links.
  md.disable('image');

  const SAFE_URL = /^(?:https?:|mailto:|[^a-z]|[a-z+.-]+(?:[^a-z+.\-:]|$))/i;
  const baseValidate = md.validateLink.bind(md);
  // markdown-it already refuses javascript:, vbscript: and file:; data: URLs go too.
  md.validateLink = (url) => baseValidate(url) && !/^\s*data:/i.test(url) && SAFE_URL.test(url.trim());

  const escape = md.utils.escapeHtml;

  md.renderer.rules.fence = (tokens, idx) => {
    const token = tokens[idx];
    const lang = (token.info || '').trim().split(/\s+/)[0].replace(/[^\w+#.-]/g, '').slice(0, 30);
    const langClass = lang ? ` class="language-${escape(lang)}"` : '';
    return (
      '<div class="code-block">' +
      `<div class="code-head"><span class="code-lang">${escape(lang || 'text')}</span>` +
      '<button type="button" class="copy-code" aria-label="Copy code">Copy</button></div>' +
      `<pre><code${langClass}>${escape(token.content)}</code></pre></div>\n`
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

  // A DocumentFragment of the rendered, sanitised Markdown.
  function render(text) {
    return window.DOMPurify.sanitize(md.render(text || ''), PURIFY);
  }

  window.ChatMarkdown = { render };
})();
