#!/usr/bin/env bun
// The entry `bun build --compile` starts from; the CLI lives in src/cli.
console.log("tl-engine: not yet — the engine lands with the engine issue.");
