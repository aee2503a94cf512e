// On a phone the sidebar is a drawer; on wider screens the class changes nothing.
import { els } from './dom.js';

export function setSidebar(open) {
  els.app.classList.toggle('sidebar-open', open);
  els.sidebarToggle.setAttribute('aria-expanded', String(open));
  if (open) requestAnimationFrame(() => els.search.focus()); // once the drawer is visible
  else if (document.activeElement?.closest('#sidebar')) els.sidebarToggle.focus();
}

export function sidebarOpen() { return els.app.classList.contains('sidebar-open'); }
