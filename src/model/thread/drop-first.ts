/**
 * Drops a short queue's first entry by moving the rest down: Array.prototype.shift is a call
 * into the runtime, and the engine's step queue and the model worker's forwards in flight each
 * drop one a step.
 */
export function dropFirst<T>(a: T[]): void {
  for (let i = 1; i < a.length; i++) a[i - 1] = a[i]!;
  a.pop();
}
