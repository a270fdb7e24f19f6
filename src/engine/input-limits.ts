/**
 * Bounds every front end (HTTP, EngineControl) checks on a request before any work: a
 * token covers at most MAX_CHARS_PER_TOKEN characters of text here, so text longer than
 * that many per token of context can only tokenize past it.
 */
export const MAX_CHARS_PER_TOKEN = 64;
export const MAX_STOP_SEQUENCES = 4;
export const MAX_STOP_CHARS = 1024;
export const MAX_STOP_TOKEN_IDS = 256;
