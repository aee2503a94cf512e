// The output policy's change form folds its rarely used fieldsets (chat/admin/policies.py); one
// holding an error opens by itself, so a refused save never hides its reason.
(() => {
  'use strict';

  function openFoldsWithErrors() {
    for (const fold of document.querySelectorAll('fieldset details')) {
      if (fold.querySelector('.errorlist, .errors')) fold.open = true;
    }
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', openFoldsWithErrors);
  else openFoldsWithErrors();
})();
