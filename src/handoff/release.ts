/** What can give a pending handle back on its decode engine (KvTransport.release). */
export interface HandleReleaser {
  release?(target: string, handleId: string): Promise<boolean>;
}

/**
 * The one place a handle nobody will claim goes back to its decode engine now rather
 * than at its time to live: the prefill engine after a push whose caller is gone or
 * whose ack was lost, the gateway when its client left before the resume. Best effort
 * (Release is idempotent on D); `onError` hears a failed attempt. The promise never
 * rejects: it says when the attempt is over, for a caller that must outlast it.
 */
export function releaseUnclaimed(releaser: HandleReleaser, target: string, handleId: string, onError?: (e: unknown) => void): Promise<void> {
  const attempt = releaser.release?.(target, handleId);
  if (attempt === undefined) return Promise.resolve();
  return attempt.then(
    () => {},
    (e: unknown) => onError?.(e),
  );
}
