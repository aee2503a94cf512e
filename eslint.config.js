// ESLint for the page's own scripts (`make lint`); the vendored libraries are not ours to lint.
const js = require('@eslint/js');
const globals = require('globals');

module.exports = [
  { ignores: ['static/vendor/**', 'node_modules/**', '.venv/**', 'var/**', 'staticfiles/**'] },
  js.configs.recommended,
  {
    // The chat page: ES modules (static/chat/page/main.js imports the rest).
    files: ['static/chat/page/**/*.js'],
    languageOptions: { ecmaVersion: 2022, sourceType: 'module', globals: globals.browser },
  },
  {
    // Classic scripts: markdown.js (shared with the admin), the admin's and the benchmark's.
    files: ['static/**/*.js'],
    ignores: ['static/chat/page/**'],
    languageOptions: { ecmaVersion: 2022, sourceType: 'script', globals: globals.browser },
  },
  {
    files: ['eslint.config.js'],
    languageOptions: { sourceType: 'commonjs', globals: globals.node },
  },
];
