/**
 * What a start-up sequence has started, to stop on failure or shutdown: each server is
 * added as it starts, and `closeAll` stops them newest first, so a failure anywhere stops
 * exactly what was started. A close that fails does not keep the others open.
 */
export class Closers {
  private readonly list: (() => Promise<unknown>)[] = [];

  add(...close: (() => Promise<unknown>)[]): void {
    this.list.push(...close);
  }

  async closeAll(): Promise<void> {
    while (this.list.length > 0) await this.list.pop()!().catch(() => {});
  }
}
