/**
 * Cutting streamed text into the pieces the pacing buffer releases: tokens, words or
 * sentences. Words and sentences are cut with `Intl.Segmenter`, whose dictionary-based
 * word breaks handle scripts written without spaces (Chinese, Japanese, Thai).
 *
 * A word piece is a word with the spaces and punctuation that follow it ("world. "); a
 * sentence piece is a sentence with its trailing space. A piece is complete once the
 * next one has begun (or the text has ended), and then carries the tokens whose text
 * ends inside it: a chunk of n tokens spreads them evenly over its text. A piece in which
 * no token ends joins the next one, so that one token's text goes out at once.
 */

/** A unit of release: its text, the tokens it holds, and the source of its last character. */
export interface Piece<S> {
  text: string;
  tokens: number;
  source: S;
}

/** The pacing unit. */
export type Unit = "token" | "word" | "sentence";

const graphemes = new Intl.Segmenter(undefined, { granularity: "grapheme" });
const words = new Intl.Segmenter(undefined, { granularity: "word" });
const sentences = new Intl.Segmenter(undefined, { granularity: "sentence" });

/** Offsets where a new piece starts after the first; `final` when the text will not grow. */
function pieceStarts(text: string, unit: "word" | "sentence", final: boolean): number[] {
  const starts: number[] = [];
  if (unit === "sentence") {
    for (const s of sentences.segment(text)) if (s.index > 0) starts.push(s.index);
    return starts;
  }
  // Each word-like segment after the first starts a piece. Where no space or punctuation
  // separates it from the previous word (Chinese, Japanese), the break is trusted only
  // once a further word has begun: the dictionary may still join the two ("と" + "て").
  const wordStarts: Array<{ index: number; spaced: boolean }> = [];
  let previousEnd = -1;
  for (const s of words.segment(text)) {
    if (!s.isWordLike) continue;
    wordStarts.push({ index: s.index, spaced: s.index !== previousEnd });
    previousEnd = s.index + s.segment.length;
  }
  wordStarts.forEach((w, i) => {
    if (i > 0 && (final || w.spaced || i < wordStarts.length - 1)) starts.push(w.index);
  });
  return starts;
}

/**
 * `text` of `tokens` tokens (a chunk that carries several) cut into at most `tokens`
 * pieces: between words where it can (the longest piece halved, by graphemes, while
 * there are fewer pieces than tokens; neighbours joined while there are more). A piece a
 * token, the tokens the text is too short for on the last, as the Python client cuts.
 */
export function splitTokens(text: string, tokens: number): Array<{ text: string; tokens: number }> {
  const bounds = [0, ...pieceStarts(text, "word", true), text.length];
  let parts = bounds.slice(1).map((end, i) => Array.from(graphemes.segment(text.slice(bounds[i], end)), (g) => g.segment));
  while (parts.length < tokens) {
    const longest = parts.reduce((best, part, i) => (part.length > (parts[best] as string[]).length ? i : best), 0);
    const part = parts[longest] as string[];
    if (part.length < 2) break;
    const half = Math.floor(part.length / 2);
    parts.splice(longest, 1, part.slice(0, half), part.slice(half));
  }
  if (parts.length > tokens) {
    const k = parts.length;
    parts = Array.from({ length: tokens }, (_, j) => parts.slice(Math.floor((j * k) / tokens), Math.floor(((j + 1) * k) / tokens)).flat());
  }
  return parts.map((part, i) => ({ text: part.join(""), tokens: i === parts.length - 1 ? tokens - parts.length + 1 : 1 }));
}

/** Where a sentence may end (UAX #29: terminators and paragraph separators). */
const SENTENCE_END = /[\p{Sentence_Terminal}\n\r\u0085\u2028\u2029]/u;
/** A letter or digit after a sentence end settles whether the sentence ended there. */
const SETTLES = /[\p{L}\p{N}]/u;

/** Whether `text` leaves a sentence end not yet settled by a letter or digit, given the state before it. */
function openSentenceEnd(text: string, openBefore: boolean): boolean {
  let open = openBefore;
  for (const ch of text) {
    if (SENTENCE_END.test(ch)) open = true;
    else if (SETTLES.test(ch)) open = false;
  }
  return open;
}

/** Incremental word or sentence cutter for one text stream (one choice, one field). */
export class TextCutter<S> {
  private pending = "";
  /** End offset (in `pending`) of each token not yet released. */
  private tokenEnds: number[] = [];
  /** End offset of each pushed text still in `pending`, with its source. */
  private spans: Array<{ end: number; source: S }> = [];
  /** Sentences: a terminator in `pending` not yet followed by a letter or digit. */
  private openEnd = false;

  constructor(private readonly unit: "word" | "sentence") {}

  /** Add `text` holding `tokens` tokens; return the pieces it completes. */
  push(text: string, tokens: number, source: S): Array<Piece<S>> {
    const start = this.pending.length;
    for (let i = 1; i <= tokens; i++) {
      this.tokenEnds.push(start + Math.max(1, Math.round((text.length * i) / tokens)));
    }
    this.pending += text;
    this.spans.push({ end: this.pending.length, source });
    if (this.unit === "sentence") {
      // A new sentence can begin only around a sentence end: without one open or new,
      // skip segmenting (a long sentence would otherwise be scanned again at every token).
      const open = this.openEnd;
      this.openEnd = openSentenceEnd(text, open);
      if (!open && !SENTENCE_END.test(text)) return [];
    }
    const pieces = this.cut(false);
    if (pieces.length > 0 && this.unit === "sentence") this.openEnd = openSentenceEnd(this.pending, false);
    return pieces;
  }

  /** The text ended: the pieces left, all of them. */
  flush(): Array<Piece<S>> {
    const out = this.cut(true);
    if (this.pending !== "") out.push(this.take(this.pending.length));
    return out;
  }

  private cut(final: boolean): Array<Piece<S>> {
    const out: Array<Piece<S>> = [];
    let cut = 0;
    for (const next of pieceStarts(this.pending, this.unit, final)) {
      // A piece in which no token ends (one token spanning two words) joins the next one.
      if (!this.tokenEnds.some((end) => end <= next - cut)) continue;
      out.push(this.take(next - cut));
      cut = next;
    }
    return out;
  }

  /** Remove the first `length` characters as a piece. */
  private take(length: number): Piece<S> {
    const text = this.pending.slice(0, length);
    const span = this.spans.find((s) => s.end >= length) as { end: number; source: S };
    const tokens = this.tokenEnds.filter((end) => end <= length).length;
    this.pending = this.pending.slice(length);
    this.tokenEnds = this.tokenEnds.filter((end) => end > length).map((end) => end - length);
    this.spans = this.spans.filter((s) => s.end > length).map((s) => ({ end: s.end - length, source: s.source }));
    return { text, tokens, source: span.source };
  }
}
