import assert from "node:assert/strict";
import { test } from "node:test";
import { splitTokens, TextCutter, type Piece } from "../src/segment.js";

/** Feed `text` one character (one token) at a time; the pieces, and their tokens. */
function streamed(text: string, unit: "word" | "sentence"): Array<Piece<number>> {
  const cutter = new TextCutter<number>(unit);
  const out: Array<Piece<number>> = [];
  Array.from(text).forEach((ch, i) => out.push(...cutter.push(ch, 1, i)));
  return [...out, ...cutter.flush()];
}

const texts = (pieces: Array<Piece<number>>): string[] => pieces.map((p) => p.text);

test("words: a word with the spaces and punctuation after it, complete once the next begins", () => {
  const cutter = new TextCutter<string>("word");
  assert.deepEqual(cutter.push("Hello", 1, "a"), []);
  assert.deepEqual(cutter.push(",", 1, "b"), []);
  assert.deepEqual(cutter.push(" wor", 1, "c"), [{ text: "Hello, ", tokens: 2, source: "c" }]);
  assert.deepEqual(cutter.push("ld", 1, "d"), []);
  assert.deepEqual(cutter.flush(), [{ text: "world", tokens: 2, source: "d" }]);
  assert.deepEqual(texts(streamed("It's 3.14 today, isn't it?", "word")), ["It's ", "3.14 ", "today, ", "isn't ", "it?"]);
});

test("a word in which no token ends goes out with the next word", () => {
  const cutter = new TextCutter<number>("word");
  assert.deepEqual(cutter.push("Hello big", 1, 0), [], "one token: Hello and big are the same token");
  assert.deepEqual(cutter.push(" world", 1, 1), [{ text: "Hello big ", tokens: 1, source: 1 }]);
  assert.deepEqual(cutter.flush(), [{ text: "world", tokens: 1, source: 1 }]);
});

test("Chinese words are cut by the dictionary, not per character nor per sentence", () => {
  const text = "我们今天去公园散步，然后一起吃晚饭。";
  const pieces = streamed(text, "word");
  assert.equal(texts(pieces).join(""), text);
  assert.ok(pieces.length >= 6 && pieces.length < Array.from(text).length, texts(pieces).join("|"));
  for (const word of ["我们", "今天", "公园", "散步，", "晚饭。"]) assert.ok(texts(pieces).includes(word), `${word} in ${texts(pieces).join("|")}`);
  assert.equal(
    pieces.reduce((n, p) => n + p.tokens, 0),
    Array.from(text).length,
    "every token is in one piece",
  );
  assert.equal(pieces.find((p) => p.text === "散步，")?.tokens, 3);
});

test("Japanese words are cut by the dictionary, and a word streamed in parts is not split", () => {
  const text = "今日はとても良い天気ですね。散歩に行きましょう。";
  const pieces = texts(streamed(text, "word"));
  assert.equal(pieces.join(""), text);
  for (const word of ["今日", "とても", "良い", "天気", "散歩"]) assert.ok(pieces.includes(word), `${word} in ${pieces.join("|")}`);
  assert.ok(!pieces.includes("と"), "とても arrived character by character and stays one word");
});

test("sentences, in English, Chinese and Japanese", () => {
  assert.deepEqual(texts(streamed("Hi there. How are you? Fine.", "sentence")), ["Hi there. ", "How are you? ", "Fine."]);
  assert.deepEqual(texts(streamed("你好。我是小明。今天天气很好！", "sentence")), ["你好。", "我是小明。", "今天天气很好！"]);
  assert.deepEqual(texts(streamed("こんにちは。元気ですか？はい、元気です。", "sentence")), ["こんにちは。", "元気ですか？", "はい、元気です。"]);
  const cutter = new TextCutter<number>("sentence");
  assert.deepEqual(cutter.push("One. Two", 2, 0), [{ text: "One. ", tokens: 1, source: 0 }], "tokens spread over the chunk's text");
});

test("sentences streamed a character at a time are cut as the whole text is", () => {
  const text = 'Pi is 3.14 today. Mr. Smith said e.g. this is fine! Really?\nYes. (Quoted.) "Done." Next line';
  const whole = new TextCutter<number>("sentence");
  const atOnce = texts([...whole.push(text, text.length, 0), ...whole.flush()]);
  assert.deepEqual(texts(streamed(text, "sentence")), atOnce);
  assert.deepEqual(atOnce.slice(0, 3), ["Pi is 3.14 today. ", "Mr. ", "Smith said e.g. this is fine! "]);
});

test("a chunk of several tokens splits between words where it can, else within them (whole graphemes)", () => {
  assert.deepEqual(splitTokens("Hello big world", 3), [
    { text: "Hello ", tokens: 1 },
    { text: "big ", tokens: 1 },
    { text: "world", tokens: 1 },
  ]);
  assert.deepEqual(splitTokens("one two three four", 2), [
    { text: "one two ", tokens: 1 },
    { text: "three four", tokens: 1 },
  ]);
  assert.deepEqual(splitTokens("Hello", 2), [
    { text: "He", tokens: 1 },
    { text: "llo", tokens: 1 },
  ]);
  assert.deepEqual(splitTokens("👍🏽!", 4), [
    { text: "👍🏽", tokens: 1 },
    { text: "!", tokens: 3 },
  ]);
});
