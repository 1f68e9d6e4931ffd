/**
 * The demo chat page (/demo), built from the web SDK's composable parts: the page
 * fetches the stream, `parseSSE` and `openAIChunks` read its chunks (the page notes when
 * each arrives, for the live plot), and `paceStream` releases them on the tier's pacing
 * clock (the headers say which) and, once the reply ends, reports its QoE to the gateway
 * with the response's telemetry token, never with the key. While the gateway holds the
 * request for an engine, its queue notices (SSE comments, `parseQueueNotice`) say how long
 * the wait should be. The plot shows arrivals against what was displayed, with its
 * freezes shaded, and the tier's expected line; the QoE and the longest freeze appear at
 * the end.
 * While the reply streams, the page's reader channel tells the gateway when the tab is
 * hidden (away: the page stops showing and keeps the reader's place), shown again
 * (watching), when the reader waits on an empty buffer, and when the page closes or Stop is
 * pressed (left); on the voice tier, Pause speech pauses the speech and tells the gateway
 * the listener is away, Resume speech that they are back. The "Reader signals" panel
 * lists each signal sent and its answer.
 * On the voice tier the reply is spoken sentence by sentence where the browser can, and
 * the page says whether it can. Send stays disabled until a key is accepted.
 */
import {
  openAIChunks,
  paceStream,
  parseQueueNotice,
  parseSSE,
  type ChatCompletionChunk,
  type Freezes,
  type PacedStream,
  type QueueNotice,
} from "../../sdk_web/src/index.js";
import { askAgain, askForKey, byId, errorMessage, KeyStore } from "./session.js";
import { SignalPanel } from "./signal_panel.js";
import { canSpeak, onVoicesChanged, SentenceSpeaker, speechSupport } from "./speech.js";
import { TimelinePlot } from "./timeline_plot.js";

type Tier = "chat" | "voice" | "fast";
interface Message {
  role: "user" | "assistant";
  content: string;
}

const keys = new KeyStore("tokenpace.apiKey");
const keyForm = byId<HTMLFormElement>("key-form");
const ask = byId<HTMLFormElement>("ask");
const tierSelect = byId<HTMLSelectElement>("tier");
const maxTokens = byId<HTMLInputElement>("max-tokens");
const message = byId<HTMLTextAreaElement>("message");
const send = byId<HTMLButtonElement>("send");
const stop = byId<HTMLButtonElement>("stop");
const pauseSpeech = byId<HTMLButtonElement>("pause-speech");
const status = byId<HTMLSpanElement>("status");
const reply = byId<HTMLDivElement>("reply");
const problem = byId<HTMLParagraphElement>("problem");
const speech = byId<HTMLParagraphElement>("speech");
const plot = new TimelinePlot(byId("plot"));
const signals = new SignalPanel(byId<HTMLTableSectionElement>("signals"), byId("presence"));

const history: Message[] = [];
let apiKey: string | null = null;
let model: string | null = null;
let current: AbortController | null = null;
/** The reply being spoken (voice tier), while it streams: Pause speech tells it the listener is away. */
let spoken: PacedStream<ChatCompletionChunk> | null = null;

/** Pause or resume the speech: the listener is away while it is paused, and the reply waits for them. */
function toggleSpeech(): void {
  if (spoken === null) return;
  const pausing = pauseSpeech.getAttribute("aria-pressed") !== "true";
  pauseSpeech.setAttribute("aria-pressed", String(pausing));
  pauseSpeech.textContent = pausing ? "Resume speech" : "Pause speech";
  if (canSpeak()) {
    if (pausing) speechSynthesis.pause();
    else speechSynthesis.resume();
  }
  spoken.setPresence(pausing ? "away" : "watching");
}

/** Pause speech is offered while a voice reply streams. */
function offerPause(stream: PacedStream<ChatCompletionChunk> | null): void {
  if (stream === null && pauseSpeech.getAttribute("aria-pressed") === "true" && canSpeak()) speechSynthesis.resume();
  spoken = stream;
  pauseSpeech.hidden = stream === null;
  pauseSpeech.setAttribute("aria-pressed", "false");
  pauseSpeech.textContent = "Pause speech";
}

function setStatus(state: "no-key" | "idle" | "waiting" | "queued" | "streaming" | "done" | "aborted" | "error", text: string): void {
  status.dataset["state"] = state;
  status.textContent = text;
}

/** No usable key: ask for one, and nothing can be sent until it is given. */
function needKey(): void {
  askAgain(keys, keyForm);
  apiKey = null;
  send.disabled = true;
  setStatus("no-key", "Give the API key above to send a message.");
}

/** On the voice tier: whether this browser can speak the reply. */
function showSpeech(): void {
  speech.hidden = tierSelect.value !== "voice";
  speech.textContent = speechSupport();
}

async function loadModel(key: string): Promise<void> {
  const response = await fetch("/v1/models", { headers: { Authorization: `Bearer ${key}` } });
  if (response.status === 401) {
    needKey();
    problem.textContent = `The key was refused: ${await errorMessage(response)}`;
    return;
  }
  if (!response.ok) {
    problem.textContent = `Listing the models failed: ${await errorMessage(response)}`;
    return;
  }
  const body = (await response.json()) as { data: Array<{ id: string }> };
  model = body.data[0]?.id ?? null;
  byId("model").textContent = model ? `model: ${model}` : "no model is served";
  apiKey = key;
  problem.textContent = "";
  send.disabled = model === null;
  if (model !== null) setStatus("idle", "Ready.");
}

/** The longest freeze, how many and how long in all; "none" for a reply that never froze. */
function freezeText(freezes: Freezes | undefined): string {
  if (freezes === undefined) return "–";
  if (freezes.count === 0) return "none";
  const count = `${freezes.count} freeze${freezes.count === 1 ? "" : "s"}`;
  return `${freezes.longestS.toFixed(3)} s (${count}, ${freezes.totalS.toFixed(3)} s in all)`;
}

function showQoE(stream: PacedStream<ChatCompletionChunk>): void {
  const qoe = stream.qoe;
  byId("qoe").hidden = qoe === undefined;
  if (!qoe) return;
  byId("qoe-displayed").textContent = qoe.displayedAndes.toFixed(3);
  byId("qoe-arrivals").textContent = qoe.andes.toFixed(3);
  byId("qoe-displayed-monotone").textContent = qoe.displayedMonotone.toFixed(3);
  byId("qoe-freeze").textContent = freezeText(qoe.displayedFreezes);
  byId("qoe-idle").textContent = qoe.displayedIdleS === undefined ? "–" : `${qoe.displayedIdleS.toFixed(3)} s`;
  byId("qoe-tier").textContent = `${stream.tier} (TTFT ${stream.expected.ttft} s, TDS ${stream.expected.tds} tokens/s)`;
  byId("qoe-request").textContent = stream.requestId ?? "";
  byId("qoe-reported").textContent = "sending…";
  void stream.reported.then((result) => {
    byId("qoe-reported").textContent = result
      ? `recorded by the gateway (its Andes QoE of what was displayed: ${result.qoe.displayed_andes?.toFixed(3) ?? "–"})`
      : "not recorded";
  });
}

/** The reply text a chunk carries (its first choice's `delta.content`). */
function contentOf(chunk: ChatCompletionChunk): string {
  const content = chunk.choices[0]?.delta?.["content"];
  return typeof content === "string" ? content : "";
}

/** What the status says while the gateway holds the request for an engine. */
function waitingText({ position, etaS }: QueueNotice): string {
  const eta = etaS > 0 ? `, about ${Math.ceil(etaS)} s` : "";
  return `Waiting for an engine${eta} (number ${position} in line)…`;
}

/**
 * The stream's chunks as they come off the network, each arrival noted on the plot;
 * queue notices go to `onQueued`.
 */
async function* arriving(
  body: ReadableStream<Uint8Array>,
  requestId: string | undefined,
  sentAt: number,
  onQueued: (notice: QueueNotice) => void,
) {
  const onComment = (comment: string): void => {
    const notice = parseQueueNotice(comment);
    if (notice !== undefined) onQueued(notice);
  };
  for await (const chunk of openAIChunks(parseSSE(body, { onComment }), requestId)) {
    const tokens = chunk.choices.filter((c) => typeof c.delta?.["content"] === "string" && c.delta["content"] !== "").length;
    if (tokens > 0) plot.addArrived([(performance.now() - sentAt) / 1000, tokens]);
    yield chunk;
  }
}

async function converse(text: string, tier: Tier): Promise<void> {
  if (!apiKey || !model) return;
  const speaker = tier === "voice" ? new SentenceSpeaker(document.documentElement.lang) : null;
  const controller = new AbortController();
  current = controller;
  history.push({ role: "user", content: text });
  reply.textContent = "";
  byId("qoe").hidden = true;
  plot.reset(null);
  setStatus("waiting", "Waiting for the first token…");
  send.disabled = true;
  stop.disabled = false;
  let answer = "";
  const sentAt = performance.now();
  signals.reset(sentAt);
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: {
        Authorization: `Bearer ${apiKey}`,
        "Content-Type": "application/json",
        "X-TokenPace-Tier": tier,
      },
      body: JSON.stringify({ model, messages: history, stream: true, max_tokens: Number(maxTokens.value) || 80 }),
      signal: controller.signal,
    });
    if (!response.ok || response.body === null) {
      const message = await errorMessage(response);
      if (response.status === 401) needKey();
      throw new Error(message);
    }
    const requestId = response.headers.get("X-Request-Id") ?? undefined;
    let started = false; // a token was shown
    const onQueued = (notice: QueueNotice): void => {
      if (!started) setStatus("queued", waitingText(notice));
    };
    const stream = paceStream(arriving(response.body, requestId, sentAt, onQueued), {
      headers: response.headers,
      requestStart: sentAt,
      signal: controller.signal,
      telemetry: { url: "/v1/tokenpace/telemetry" },
      readerSignals: {
        transport: signals.transport({
          url: "/v1/tokenpace/reader",
          token: response.headers.get("X-TokenPace-Telemetry-Token") ?? undefined,
        }),
      },
    });
    plot.setExpected(stream.expected);
    if (speaker !== null) offerPause(stream);
    for await (const chunk of stream) {
      const piece = contentOf(chunk);
      if (!piece) continue;
      if (!started) setStatus("streaming", `Streaming on the ${stream.tier} tier…`);
      started = true;
      answer += piece;
      reply.textContent = answer;
      plot.addShown([(performance.now() - sentAt) / 1000, 1]);
      speaker?.push(piece);
    }
    if (stream.outcome === "aborted") speaker?.cancel();
    else speaker?.flush();
    if (stream.timeline) plot.setTimelines(stream.timeline.arrivals, stream.timeline.displayed);
    showQoE(stream);
    const aborted = stream.outcome === "aborted";
    setStatus(aborted ? "aborted" : "done", aborted ? "Stopped." : "Done.");
  } catch (error) {
    speaker?.cancel();
    const aborted = controller.signal.aborted;
    setStatus(aborted ? "aborted" : "error", aborted ? "Stopped." : `Failed: ${error instanceof Error ? error.message : String(error)}`);
  } finally {
    offerPause(null);
    history.push({ role: "assistant", content: answer });
    current = null;
    send.disabled = apiKey === null || model === null;
    stop.disabled = true;
  }
}

askForKey(keys, keyForm, (key) => void loadModel(key));
byId("forget-key").addEventListener("click", needKey);
tierSelect.addEventListener("change", showSpeech);
onVoicesChanged(showSpeech);
showSpeech();
ask.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = message.value.trim();
  if (text) void converse(text, tierSelect.value as Tier);
});
stop.addEventListener("click", () => current?.abort());
pauseSpeech.addEventListener("click", toggleSpeech);
