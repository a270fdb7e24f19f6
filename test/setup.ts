// Engines and the gateway log JSON lines; tests read outcomes, not logs.
process.env.TL_LOG_LEVEL ??= "error";
