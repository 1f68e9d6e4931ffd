/**
 * The key a page works with: asked for once, kept in sessionStorage (gone when the tab
 * closes), sent as `Authorization: Bearer KEY` to the gateway that served the page.
 */

export class KeyStore {
  constructor(private readonly name: string) {}

  get(): string | null {
    return sessionStorage.getItem(this.name);
  }

  set(key: string): void {
    sessionStorage.setItem(this.name, key);
  }

  forget(): void {
    sessionStorage.removeItem(this.name);
  }
}

/** An OpenAI-style error body's message, else the status line. */
export async function errorMessage(response: Response): Promise<string> {
  try {
    const body = (await response.json()) as { error?: { message?: string } };
    if (body.error?.message) return body.error.message;
  } catch {
    // not JSON: fall back to the status
  }
  return `${response.status} ${response.statusText}`;
}

/** GET a JSON document from this gateway with the key; throws an Error with its message. */
export async function getJSON<T>(path: string, key: string): Promise<T> {
  const response = await fetch(path, { headers: { Authorization: `Bearer ${key}` } });
  if (!response.ok) throw new HttpError(response.status, await errorMessage(response));
  return (await response.json()) as T;
}

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/**
 * Wires a key form: `form` holds an `input[name=key]`; `onKey` runs with the stored key
 * at once, else with the one entered, which is then stored. `askAgain` forgets a key the
 * gateway refused and shows the form again.
 */
export function askForKey(store: KeyStore, form: HTMLFormElement, onKey: (key: string) => void): void {
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const input = form.elements.namedItem("key") as HTMLInputElement;
    const key = input.value.trim();
    if (!key) return;
    store.set(key);
    input.value = "";
    form.hidden = true;
    onKey(key);
  });
  const stored = store.get();
  form.hidden = stored !== null;
  if (stored !== null) onKey(stored);
}

export function askAgain(store: KeyStore, form: HTMLFormElement): void {
  store.forget();
  form.hidden = false;
}

/** `el` by id, typed; throws when the page lacks it (a page and its script out of step). */
export function byId<T extends HTMLElement>(id: string): T {
  const el = document.getElementById(id);
  if (!el) throw new Error(`#${id} is missing from the page`);
  return el as T;
}
