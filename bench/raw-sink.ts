// The raw TCP sink both transfer benchmarks compare against, in or out of process.

/** Accepts bytes and answers one byte per `total` received: the sender's "all arrived". */
export function listenRawSink(total: number) {
  let got = 0;
  const one = new Uint8Array(1);
  return Bun.listen({
    hostname: "127.0.0.1",
    port: 0,
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
