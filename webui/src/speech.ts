/**
 * Speaks a reply sentence by sentence as the pacing buffer shows it (the voice tier),
 * through the browser's speechSynthesis where it has one. Sentences are cut with
 * Intl.Segmenter, so text without spaces (Chinese, Japanese) is cut correctly too.
 */

export function canSpeak(): boolean {
  return typeof window !== "undefined" && "speechSynthesis" in window;
}

/** What this browser can do for the voice tier, in a sentence for the page. */
export function speechSupport(): string {
  if (!canSpeak()) return "This browser has no speech synthesis: the voice tier's reply is shown, not spoken.";
  const voices = speechSynthesis.getVoices().length;
  if (voices === 0) return "This browser has speech synthesis but no voices installed: the voice tier's reply is shown, not spoken.";
  return `This browser speaks the voice tier's reply, sentence by sentence (${voices} voice${voices === 1 ? "" : "s"} installed).`;
}

/** Calls `onChange` when the browser's voices load or change (they load after the page). */
export function onVoicesChanged(onChange: () => void): void {
  if (canSpeak()) speechSynthesis.addEventListener("voiceschanged", onChange);
}

/** The complete sentences at the start of `text`, and the rest (a sentence still open). */
export function completeSentences(text: string, locale?: string): [string[], string] {
  const segments = [...new Intl.Segmenter(locale, { granularity: "sentence" }).segment(text)];
  if (segments.length === 0) return [[], ""];
  const last = segments[segments.length - 1]!;
  // the last segment is complete only once whitespace follows its end mark
  const closed = /[.!?。！？]\s+$/u.test(last.segment);
  const done = closed ? segments : segments.slice(0, -1);
  return [done.map((s) => s.segment), closed ? "" : last.segment];
}

export class SentenceSpeaker {
  private buffer = "";
  spoken = 0;

  constructor(private readonly lang?: string) {}

  /** More displayed text; speaks each sentence it completes. */
  push(text: string): void {
    this.buffer += text;
    const [sentences, rest] = completeSentences(this.buffer, this.lang);
    this.buffer = rest;
    for (const sentence of sentences) this.say(sentence);
  }

  /** The reply ended: speak what is left. */
  flush(): void {
    if (this.buffer.trim()) this.say(this.buffer);
    this.buffer = "";
  }

  cancel(): void {
    this.buffer = "";
    if (canSpeak()) speechSynthesis.cancel();
  }

  private say(sentence: string): void {
    this.spoken += 1;
    if (!canSpeak() || !sentence.trim()) return;
    const utterance = new SpeechSynthesisUtterance(sentence.trim());
    if (this.lang) utterance.lang = this.lang;
    speechSynthesis.speak(utterance);
  }
}
