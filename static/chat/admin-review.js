// The cached-answer detail page: show the answer rendered as the chat page renders it.
document.addEventListener('DOMContentLoaded', () => {
  for (const node of document.querySelectorAll('.rendered-answer[data-markdown]')) {
    node.replaceChildren(window.ChatMarkdown.render(node.dataset.markdown));
  }
});
