'use strict';
// interop.js -- the unchanged amqplib (Node.js AMQP 0-9-1 client, promise API)
// against an AMQP 0-9-1 broker.  Run by tests/integration/08-amqplib.py.
//
//   node interop.js HOST PORT [URL-QUERY]
//
// URL-QUERY (optional, e.g. "frameMax=4096&heartbeat=2") is appended to the
// connection URL amqp://guest:guest@HOST:PORT/%2F.  If it sets heartbeat, an
// extra step stays idle for 3 intervals + 1 s before closing.
//
// Prints one `OK <step>` line per step and `ALL OK` at the end (exit 0).  On
// any failure prints `FAIL <step>: <reason>` and exits 1.  A watchdog turns a
// hang into a failure.

const amqp = require('amqplib');

const [host, port, query] = process.argv.slice(2);
if (!host || !port) {
  console.log('FAIL usage: node interop.js HOST PORT [URL-QUERY]');
  process.exit(1);
}
const URL = `amqp://guest:guest@${host}:${port}/%2F` + (query ? `?${query}` : '');

const N = 1000;
const PREFETCH = 50;
const TIMESTAMP = 1700000000;   // seconds, property `timestamp`
const RUN = `${process.pid}-${Date.now() % 100000}`;
const EXCHANGE = `quay-amqplib-topic-${RUN}`;

let step = 'start';
const WATCHDOG_MS = 90000;
const watchdog = setTimeout(() => {
  console.log(`FAIL ${step}: timed out after ${WATCHDOG_MS / 1000} s`);
  process.exit(1);
}, WATCHDOG_MS);

function fail(msg) { throw new Error(msg); }

function check(cond, msg) { if (!cond) fail(msg); }

function show(v) {
  return JSON.stringify(v, (k, x) =>
    (x && x.type === 'Buffer' && Array.isArray(x.data)) ? `<Buffer ${x.data.length}>` : x);
}

// Deep equality for decoded field values (Buffers compared by bytes).
function same(a, b) {
  if (Buffer.isBuffer(a) || Buffer.isBuffer(b)) {
    return Buffer.isBuffer(a) && Buffer.isBuffer(b) && a.equals(b);
  }
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length &&
      a.every((x, i) => same(x, b[i]));
  }
  if (a && b && typeof a === 'object' && typeof b === 'object') {
    const ka = Object.keys(a).sort(), kb = Object.keys(b).sort();
    return same(ka, kb) && ka.every(k => same(a[k], b[k]));
  }
  return a === b;
}

function eq(actual, expected, what) {
  if (!same(actual, expected)) {
    fail(`${what}: expected ${show(expected)}, got ${show(actual)}`);
  }
}

// Resolve with the first `event` emitted by `emitter`, or reject after ms.
function once(emitter, event, ms, what) {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => {
      emitter.removeListener(event, on);
      reject(new Error(`no '${event}' event (${what}) within ${ms} ms`));
    }, ms);
    function on(v) { clearTimeout(t); resolve(v); }
    emitter.once(event, on);
  });
}

const sleep = ms => new Promise(r => setTimeout(r, ms));

function ok(s) { console.log(`OK ${s}`); }

// ---- message properties ----------------------------------------------------

function headersFor(i) {
  return {
    seq: i,                              // small int: byte/short/int on the wire
    big: 2 ** 40 + i,                    // 64-bit long
    neg: -i - 1,
    ratio: i + 0.5,                      // double
    flag: i % 2 === 0,                   // bool
    'x-str': `hello-${i}`,               // long string
    bin: Buffer.from([0, 1, 2, 255, i & 0xff]),   // byte array
    nested: { a: 'b', n: i },            // table
    list: [1, 'two', false, { k: 'v' }], // array
    nothing: null,                       // void
  };
}

function propsFor(i) {
  return {
    headers: headersFor(i),
    messageId: `msg-${i}`,
    correlationId: `corr-${i}`,
    contentType: 'application/json',
    contentEncoding: 'utf-8',
    persistent: true,
    priority: 3,
    replyTo: 'reply-here',
    timestamp: TIMESTAMP + i,
    type: 'interop.test',
    appId: 'quay-amqplib-interop',
  };
}

function bodyFor(i) {
  return Buffer.from(JSON.stringify({ seq: i, pad: 'x'.repeat(i % 97) }));
}

function routingKeyFor(i) { return `interop.msg.${i % 10}`; }

// What the consumer must see, property by property (as amqplib decodes them).
function checkMessage(msg, i, where) {
  const p = msg.properties;
  eq(msg.content.toString(), bodyFor(i).toString(), `${where} body`);
  eq(p.headers, headersFor(i), `${where} headers`);
  eq(p.messageId, `msg-${i}`, `${where} messageId`);
  eq(p.correlationId, `corr-${i}`, `${where} correlationId`);
  eq(p.contentType, 'application/json', `${where} contentType`);
  eq(p.contentEncoding, 'utf-8', `${where} contentEncoding`);
  eq(p.deliveryMode, 2, `${where} deliveryMode`);
  eq(p.priority, 3, `${where} priority`);
  eq(p.replyTo, 'reply-here', `${where} replyTo`);
  eq(p.timestamp, TIMESTAMP + i, `${where} timestamp`);
  eq(p.type, 'interop.test', `${where} type`);
  eq(p.appId, 'quay-amqplib-interop', `${where} appId`);
  eq(p.expiration, undefined, `${where} expiration`);
  eq(p.userId, undefined, `${where} userId`);
}

// ---- the steps -----------------------------------------------------------

async function main() {
  step = 'connect';
  const conn = await amqp.connect(URL);
  const connErrors = [];
  let connClosed = false;
  conn.on('error', e => connErrors.push(e));
  conn.on('close', () => { connClosed = true; });
  const sp = conn.connection.serverProperties || {};
  console.log(`# server product=${sp.product} version=${sp.version}`);
  const ch = await conn.createConfirmChannel();
  const chErrors = [];
  ch.on('error', e => chErrors.push(e));
  ok('connect');

  step = 'declare';
  const ex = await ch.assertExchange(EXCHANGE, 'topic', { durable: false, autoDelete: false });
  eq(ex.exchange, EXCHANGE, 'assertExchange result');
  const dq = await ch.assertQueue('', { exclusive: true, durable: false });
  const q = dq.queue;
  check(typeof q === 'string' && q.length > 0, `server-named queue, got ${show(q)}`);
  eq(dq.messageCount, 0, 'declare-ok messageCount');
  eq(dq.consumerCount, 0, 'declare-ok consumerCount');
  await ch.bindQueue(q, EXCHANGE, 'interop.#');
  ok('declare');

  step = 'publish-confirm';
  let acked = 0;
  const nacked = [];
  for (let i = 0; i < N; i++) {
    ch.publish(EXCHANGE, routingKeyFor(i), bodyFor(i), propsFor(i), err => {
      if (err) nacked.push(i); else acked++;
    });
  }
  await ch.waitForConfirms();
  eq(nacked, [], 'nacked publishes');
  eq(acked, N, 'acked publishes');
  ok(`publish-confirm ${N}`);

  step = 'check-queue';
  let cq = await ch.checkQueue(q);
  eq([cq.queue, cq.messageCount, cq.consumerCount], [q, N, 0], 'checkQueue (queue, messages, consumers)');
  ok(`check-queue ${N} messages 0 consumers`);

  step = 'consume';
  await ch.prefetch(PREFETCH);
  {
    let next = 0, maxUnacked = 0, windowChecked = false, lastTag = 0;
    let unacked = [];
    let seenTag = null;
    let consumeError = null;
    let resolveDone;
    const done = new Promise(r => { resolveDone = r; });
    const stop = e => { if (!consumeError) consumeError = e; resolveDone(); };
    const onMessage = msg => {
      try {
        check(msg !== null, 'consumer cancelled by the server');
        check(next < N, `unexpected extra delivery ${show(msg.properties.messageId)}`);
        const f = msg.fields;
        check(f.deliveryTag > lastTag, `delivery tag ${f.deliveryTag} not increasing (last ${lastTag})`);
        lastTag = f.deliveryTag;
        eq(f.redelivered, false, `delivery ${next} redelivered`);
        eq(f.exchange, EXCHANGE, `delivery ${next} exchange`);
        eq(f.routingKey, routingKeyFor(next), `delivery ${next} routingKey`);
        // (deliveries may be handled before consume() resolves with the tag)
        if (seenTag === null) seenTag = f.consumerTag;
        eq(f.consumerTag, seenTag, `delivery ${next} consumerTag`);
        checkMessage(msg, next, `delivery ${next}`);
        next++;
        unacked.push(msg);
        maxUnacked = Math.max(maxUnacked, unacked.length);
        check(unacked.length <= PREFETCH,
              `${unacked.length} unacked deliveries exceed prefetch ${PREFETCH}`);
        if (!windowChecked) {
          if (unacked.length === PREFETCH) {
            windowChecked = true;
            // The window is full: nothing more may arrive until we ack.
            // Then ack the whole window with one multiple ack.
            setTimeout(() => {
              try {
                eq(unacked.length, PREFETCH, 'unacked after waiting with a full window');
                ch.ack(unacked[unacked.length - 1], true);
                unacked = [];
                if (next === N) resolveDone();
              } catch (e) { stop(e); }
            }, 300);
          }
          return;
        }
        ch.ack(msg);   // after the first window: one ack per message
        unacked = unacked.filter(m => m !== msg);
        if (next === N) resolveDone();
      } catch (e) { stop(e); }
    };
    let tag;
    const c = await ch.consume(q, msg => onMessage(msg), { noAck: false });
    tag = c.consumerTag;
    check(typeof tag === 'string' && tag.length > 0, `consumer tag ${show(tag)}`);
    cq = await ch.checkQueue(q);
    eq(cq.consumerCount, 1, 'checkQueue consumerCount while consuming');
    const timer = setTimeout(() => stop(new Error(`only ${next} of ${N} delivered within 30 s`)), 30000);
    await done;
    clearTimeout(timer);
    if (consumeError) throw consumeError;
    eq(seenTag, tag, 'consumerTag of the deliveries');
    eq(maxUnacked, PREFETCH, 'largest number of unacked deliveries');
    await ch.cancel(tag);   // (amqplib 0.10.9's cancel() resolves to undefined)
    cq = await ch.checkQueue(q);
    eq([cq.messageCount, cq.consumerCount], [0, 0], 'checkQueue after consuming all (messages, consumers)');
  }
  ok(`consume ${N} in order with prefetch ${PREFETCH}`);

  step = 'basic-get';
  {
    const big = Buffer.alloc(300 * 1024);
    for (let i = 0; i < big.length; i++) big[i] = (i * 7 + 3) & 0xff;
    ch.sendToQueue(q, Buffer.from('get-0'), { messageId: 'get-0', headers: { n: 0 } });
    ch.sendToQueue(q, Buffer.from('get-1'), { messageId: 'get-1', headers: { n: 1 } });
    ch.sendToQueue(q, Buffer.from('get-2'), { messageId: 'get-2', persistent: true });
    ch.sendToQueue(q, big, { messageId: 'get-big', contentType: 'application/octet-stream' });
    await ch.waitForConfirms();

    let m = await ch.get(q);
    check(m, 'get returned empty with 4 messages queued');
    eq(m.content.toString(), 'get-0', 'get #1 body');
    eq([m.fields.exchange, m.fields.routingKey, m.fields.redelivered, m.fields.messageCount],
       ['', q, false, 3], 'get #1 (exchange, routingKey, redelivered, messageCount)');
    eq(m.properties.messageId, 'get-0', 'get #1 messageId');
    eq(m.properties.headers, { n: 0 }, 'get #1 headers');
    ch.ack(m);

    m = await ch.get(q);
    check(m, 'get #2 empty');
    eq([m.content.toString(), m.fields.messageCount], ['get-1', 2], 'get #2 (body, messageCount)');
    ch.nack(m, false, true);   // requeue: RabbitMQ puts it back at the head
    m = await ch.get(q);
    check(m, 'get #3 empty');
    eq([m.content.toString(), m.fields.redelivered, m.fields.messageCount],
       ['get-1', true, 2], 'get after nack+requeue (body, redelivered, messageCount)');
    eq(m.properties.headers, { n: 1 }, 'requeued message headers');
    ch.ack(m);

    m = await ch.get(q, { noAck: true });
    check(m, 'get #4 empty');
    eq([m.content.toString(), m.properties.deliveryMode, m.fields.messageCount],
       ['get-2', 2, 1], 'get noAck (body, deliveryMode, messageCount)');

    m = await ch.get(q, { noAck: true });
    check(m, 'get #5 (300 KB) empty');
    eq(m.properties.messageId, 'get-big', 'big message messageId');
    eq(m.properties.contentType, 'application/octet-stream', 'big message contentType');
    eq(m.content.length, big.length, 'big message length');
    check(m.content.equals(big), 'big message body differs');
    eq(m.fields.messageCount, 0, 'big message messageCount');

    m = await ch.get(q);
    eq(m, false, 'get on an empty queue');
  }
  ok('basic-get');

  step = 'mandatory-return';
  {
    const returned = once(ch, 'return', 5000, 'mandatory unroutable publish');
    let confirm = 'none';
    ch.publish(EXCHANGE, 'unroutable.key', Buffer.from('nobody-wants-me'),
               { mandatory: true, messageId: 'ret-1', headers: { why: 'no-route' } },
               err => { confirm = err ? `nack: ${err}` : 'ack'; });
    const r = await returned;
    await ch.waitForConfirms();
    eq([r.fields.replyCode, r.fields.replyText, r.fields.exchange, r.fields.routingKey],
       [312, 'NO_ROUTE', EXCHANGE, 'unroutable.key'], 'basic.return (code, text, exchange, key)');
    eq(r.content.toString(), 'nobody-wants-me', 'returned body');
    eq(r.properties.messageId, 'ret-1', 'returned messageId');
    eq(r.properties.headers, { why: 'no-route' }, 'returned headers');
    eq(confirm, 'ack', 'confirm of the returned publish');
    cq = await ch.checkQueue(q);
    eq(cq.messageCount, 0, 'queue after unroutable publish');
  }
  ok('mandatory-return');

  step = 'channel-error';
  {
    const ch2 = await conn.createChannel();
    const errs = [];
    ch2.on('error', e => errs.push(e));
    const closed = once(ch2, 'close', 5000, 'channel closed by the server');
    const missing = `quay-amqplib-missing-${RUN}`;
    let rejected = null;
    try {
      await ch2.checkQueue(missing);
    } catch (e) {
      rejected = e;
    }
    check(rejected, `checkQueue(${missing}) succeeded`);
    eq(rejected.code, 404, `checkQueue rejection code (${rejected.message})`);
    await closed;
    check(errs.length === 1, `expected one 'error' event on the channel, got ${errs.length}`);
    eq([errs[0].code, errs[0].classId, errs[0].methodId], [404, 50, 10],
       `channel error (code, class, method) (${errs[0].message})`);
    console.log(`# channel error: ${errs[0].message}`);
    let threw = false;
    try { await ch2.checkQueue(q); } catch (e) { threw = true; }
    check(threw, 'a closed channel accepted another operation');
    // The connection and the other channel survive ...
    eq(connErrors.length, 0, 'connection errors');
    check(!connClosed, 'connection closed after a channel error');
    cq = await ch.checkQueue(q);
    eq(cq.queue, q, 'checkQueue on the surviving channel');
    // ... and a new channel works.
    const ch3 = await conn.createChannel();
    const tmp = await ch3.assertQueue('', { exclusive: true });
    ch3.sendToQueue(tmp.queue, Buffer.from('after-error'));
    let m = false;
    for (let i = 0; i < 50 && !m; i++) {
      m = await ch3.get(tmp.queue, { noAck: true });
      if (!m) await sleep(20);
    }
    check(m, 'new channel: get returned nothing');
    eq(m.content.toString(), 'after-error', 'new channel get body');
    await ch3.deleteQueue(tmp.queue);
    await ch3.close();
  }
  ok('channel-error 404, connection survives');

  step = 'purge';
  {
    for (let i = 0; i < 5; i++) ch.sendToQueue(q, Buffer.from(`purge-${i}`));
    await ch.waitForConfirms();
    cq = await ch.checkQueue(q);
    eq(cq.messageCount, 5, 'checkQueue before purge');
    const p = await ch.purgeQueue(q);
    eq(p.messageCount, 5, 'purge-ok messageCount');
    cq = await ch.checkQueue(q);
    eq(cq.messageCount, 0, 'checkQueue after purge');
    eq(await ch.get(q), false, 'get after purge');
  }
  ok('purge');

  step = 'delete-queue';
  {
    for (let i = 0; i < 2; i++) ch.sendToQueue(q, Buffer.from(`del-${i}`));
    await ch.waitForConfirms();
    const d = await ch.deleteQueue(q);
    eq(d.messageCount, 2, 'delete-ok messageCount');
    const probe = await conn.createChannel();
    probe.on('error', () => {});
    let code = null;
    try { await probe.checkQueue(q); } catch (e) { code = e.code; }
    eq(code, 404, 'checkQueue of the deleted queue');
    await ch.deleteExchange(EXCHANGE);
  }
  ok('delete-queue');

  // When URL-QUERY asks for a heartbeat, stay idle for several intervals: the
  // broker must send heartbeats (amqplib drops the connection after two
  // silent intervals) and accept ours.
  const hb = conn.connection.heartbeat;
  if (new URLSearchParams(query || '').has('heartbeat')) {
    eq(hb, Number(new URLSearchParams(query).get('heartbeat')), 'negotiated heartbeat');
    step = 'heartbeat';
    const idle = 3 * hb + 1;
    await sleep(idle * 1000);
    eq(connErrors.length, 0, `connection errors after ${idle} s idle (${connErrors.join('; ')})`);
    check(!connClosed, `connection closed while idle for ${idle} s`);
    const tmp = await ch.assertQueue('', { exclusive: true });
    eq(tmp.messageCount, 0, 'declare after idle');
    await ch.deleteQueue(tmp.queue);
    ok(`heartbeat ${hb} s, idle ${idle} s`);
  }

  step = 'close';
  {
    await ch.close();
    const closedEv = once(conn, 'close', 5000, 'connection close');
    await conn.close();
    const err = await closedEv;
    check(!err, `connection 'close' event carried an error: ${err}`);
    eq(connErrors.length, 0, 'connection errors');
    eq(chErrors.length, 0, 'confirm channel errors');
  }
  ok('close');
}

main().then(() => {
  clearTimeout(watchdog);
  console.log('ALL OK');
  process.exit(0);
}, e => {
  console.log(`FAIL ${step}: ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`);
  process.exit(1);
});
