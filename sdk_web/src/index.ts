/**
 * tokenpace-web: paces streamed chat completions to the reader (the client-side token
 * buffer of Andes, Liu et al. §5) and reports the QoE the user saw to a tokenpace gateway.
 */
export { createClient } from "./client.js";
export type { ChatCompletionCreateParams, ClientOptions, RequestOptions, TokenPaceClient } from "./client.js";
export { paceOpenAI, telemetryURL } from "./openai.js";
export type { OpenAIStream, OpenAIStreamWithResponse } from "./openai.js";
export { paceStream } from "./stream.js";
export type { PacedStream, PaceOptions, ReaderSignalOptions } from "./stream.js";
export { ReaderChannel } from "./channel.js";
export type { ReaderChannelOptions, SentSignal } from "./channel.js";
export { globalPage, watchPage } from "./presence.js";
export type { PageLike, PresenceHandlers } from "./presence.js";
export {
  AWAY_LEASE_S,
  httpTransport,
  MAX_BUFFER_TOKENS,
  MAX_PACE_TPS,
  MIN_INTERVAL_S,
  PRESENCES,
  readerURL,
} from "./signals.js";
export type { Presence, ReaderSignalBody, SignalEndpoint, SignalTransport } from "./signals.js";
export type { ChunkSource } from "./reader.js";
export { systemClock } from "./clock.js";
export type { Clock } from "./clock.js";
export { TokenPaceError } from "./errors.js";
export type { ErrorBody } from "./errors.js";

// The composable parts, each usable on its own.
export { parseSSE, SSEParser } from "./sse.js";
export type { ByteSource, ServerSentEvent, SSEOptions } from "./sse.js";
export { parseQueueNotice } from "./queue.js";
export type { QueueNotice } from "./queue.js";
export { chunkTexts, chunkTokens, openAIChunks, withoutText, withText } from "./chunks.js";
export type { ChunkText, TextField, TextSlot } from "./chunks.js";
export { splitTokens, TextCutter } from "./segment.js";
export type { Piece, Unit } from "./segment.js";
export { ReleaseSchedule, releaseTimes } from "./schedule.js";
export {
  andesQoE,
  digestionStarts,
  displayGaps,
  FREEZE_EPSILON_S,
  freezes,
  freezeSpans,
  monotoneQoE,
  timelineQoE,
  tokenTimes,
  userIdleLatency,
  watchedTimes,
} from "./qoe.js";
export { ceilMicroseconds, coalesce, reportTimeline } from "./coalesce.js";
export {
  beaconReport,
  buildReport,
  MAX_BODY_BYTES,
  MAX_POINTS,
  onPageExit,
  postReport,
} from "./telemetry.js";
export type { ReportAuth, TelemetryOptions, TelemetryReport, TelemetryResult } from "./telemetry.js";
export { requestInfo } from "./headers.js";
export { DEFAULT_EXPECTATION, DEFAULT_TIER, TIERS } from "./tiers.js";
export type { RequestInfo } from "./headers.js";
export { SDK_NAME, SDK_VERSION } from "./version.js";
export type {
  ChatCompletionChunk,
  ChunkChoice,
  ChunkDelta,
  Expectation,
  Freezes,
  Outcome,
  QoE,
  Timeline,
  TimelineEntry,
  TimeSpan,
} from "./types.js";
