// The raw TCP sink both transfer benchmarks compare against, in or out of process.

/**
 * Accepts bytes and answers one byte per `total` received: the sender's "all arrived".
 * With `tls` (PEM cert, key, ca) it is raw TLS instead of raw TCP: the baseline of the
 * pushes over mutual TLS.
 */
export function listenRawSink(total: number, tls?: { cert: string; key: string; ca: string }) {
  let got = 0;
  const one = new Uint8Array(1);
  return Bun.listen({
    hostname: "127.0.0.1",
    port: 0,
    ...(tls ? { tls: { ...tls, requestCert: true, rejectUnauthorized: true } } : {}),
    socket: {
      data(s, buf) {
        got += buf.length;
        while (got >= total) {
          got -= total;
          s.write(one);
        }
      },
    },
  });
}
