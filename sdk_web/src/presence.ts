/**
 * The page's word on its reader: `document.visibilitychange` (hidden → away, visible →
 * watching) and `pagehide` (the page is going: the reader left). The page is injectable
 * (tests give a fake one); in Node, with no page, nothing is watched.
 */

/** What is read of a page: its events and its document's visibility. */
export interface PageLike {
  addEventListener(type: string, listener: () => void): void;
  removeEventListener(type: string, listener: () => void): void;
  document?: {
    visibilityState?: string;
    addEventListener(type: string, listener: () => void): void;
    removeEventListener(type: string, listener: () => void): void;
  };
}

/** What the page's events become. */
export interface PresenceHandlers {
  /** The page was hidden (true) or shown again (false). */
  hidden(hidden: boolean): void;
  /** The page is going away. */
  leaving(): void;
}

/** The global page, when there is one. */
export function globalPage(): PageLike | undefined {
  const page = globalThis as unknown as Partial<PageLike>;
  return typeof page.addEventListener === "function" && page.document !== undefined ? (page as PageLike) : undefined;
}

/**
 * Call `handlers` on the page's visibility changes and its `pagehide`; a page hidden
 * already is told at once. Returns the unsubscribe.
 */
export function watchPage(handlers: PresenceHandlers, page: PageLike | undefined = globalPage()): () => void {
  const doc = page?.document;
  if (page === undefined || doc === undefined) return () => undefined;
  const onVisibility = (): void => handlers.hidden(doc.visibilityState === "hidden");
  const onHide = (): void => handlers.leaving();
  page.addEventListener("pagehide", onHide);
  doc.addEventListener("visibilitychange", onVisibility);
  if (doc.visibilityState === "hidden") handlers.hidden(true);
  return () => {
    page.removeEventListener("pagehide", onHide);
    doc.removeEventListener("visibilitychange", onVisibility);
  };
}
