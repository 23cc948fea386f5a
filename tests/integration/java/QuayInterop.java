// QuayInterop -- drives quay (or RabbitMQ) with the unchanged RabbitMQ Java
// client (Debian librabbitmq-client-java 5.0.0).  Compiled and run by
// tests/integration/07-java.py; can also be run by hand:
//
//   javac -cp /usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar -d /tmp/qi QuayInterop.java
//   java -cp /tmp/qi:/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-nop.jar \
//        QuayInterop 127.0.0.1 5672 [nio]
//
// Prints one "OK <step>" line per step that passed and exits 0; on the first
// failure prints "FAIL <step>: <reason>" plus a stack trace and exits 1.
// With the optional third argument "nio" the client uses its NIO transport.

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.BuiltinExchangeType;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmListener;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.Consumer;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Envelope;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.LongString;
import com.rabbitmq.client.MessageProperties;
import com.rabbitmq.client.Method;
import com.rabbitmq.client.ReturnListener;
import com.rabbitmq.client.ShutdownSignalException;
import com.rabbitmq.client.impl.DefaultExceptionHandler;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Date;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

public class QuayInterop {
    static final int N = 1000;
    static final int PREFETCH = 50;
    static final String KEY_PREFIX = "quay.java.msg.";
    static final Date STAMP = new Date(1700000000000L);   // whole seconds: AMQP timestamps

    static String step = "setup";
    /** Errors raised inside client callbacks (consumer, return/confirm listeners). */
    static final ConcurrentLinkedQueue<String> asyncErrors = new ConcurrentLinkedQueue<>();

    static class Failure extends RuntimeException {
        private static final long serialVersionUID = 1L;
        Failure(String msg) { super(msg); }
    }

    static void check(boolean cond, String what) {
        if (!cond) throw new Failure(what);
    }

    static void eq(Object actual, Object expected, String what) {
        if (expected == null ? actual != null : !expected.equals(actual))
            throw new Failure(what + ": expected <" + expected + ">, got <" + actual + ">");
    }

    static void ok(String name) {
        System.out.println("OK " + name);
        System.out.flush();
    }

    static void noAsyncErrors() {
        if (!asyncErrors.isEmpty())
            throw new Failure("error(s) in client callbacks: " + asyncErrors);
    }

    static String str(Object o) {   // field-table strings arrive as LongString
        return o == null ? null : o.toString();
    }

    static Map<String, Object> headersFor(int i) {
        Map<String, Object> h = new HashMap<>();
        h.put("i", i);                                       // 'I'
        h.put("s", "str-" + i);                              // 'S'
        h.put("even", i % 2 == 0);                           // 't'
        h.put("big", (1L << 40) + i);                        // 'l'
        h.put("ratio", i / 4.0);                             // 'd'
        Map<String, Object> nested = new HashMap<>();
        nested.put("n", i * 3);
        h.put("nested", nested);                             // 'F'
        h.put("list", Arrays.asList(i, "x", true));          // 'A'
        return h;
    }

    static AMQP.BasicProperties propsFor(int i) {
        return new AMQP.BasicProperties.Builder()
                .contentType("text/plain")
                .contentEncoding("identity")
                .deliveryMode(2)
                .priority(i % 10)
                .messageId("msg-" + i)
                .correlationId("corr-" + i)
                .timestamp(STAMP)
                .appId("quay-interop")
                .headers(headersFor(i))
                .build();
    }

    static void checkMessage(int i, AMQP.BasicProperties p, byte[] body) {
        String where = "message " + i;
        eq(new String(body, StandardCharsets.UTF_8), "java-" + i, where + " body");
        eq(p.getContentType(), "text/plain", where + " content-type");
        eq(p.getContentEncoding(), "identity", where + " content-encoding");
        eq(p.getDeliveryMode(), 2, where + " delivery-mode");
        eq(p.getPriority(), i % 10, where + " priority");
        eq(p.getMessageId(), "msg-" + i, where + " message-id");
        eq(p.getCorrelationId(), "corr-" + i, where + " correlation-id");
        eq(p.getTimestamp(), STAMP, where + " timestamp");
        eq(p.getAppId(), "quay-interop", where + " app-id");
        eq(p.getReplyTo(), null, where + " reply-to (absent)");
        eq(p.getExpiration(), null, where + " expiration (absent)");
        Map<String, Object> h = p.getHeaders();
        check(h != null, where + ": headers missing");
        eq(h.size(), 7, where + " header count " + h.keySet());
        eq(h.get("i"), i, where + " header i");
        eq(str(h.get("s")), "str-" + i, where + " header s");
        check(h.get("s") instanceof LongString, where + " header s type " + h.get("s").getClass());
        eq(h.get("even"), i % 2 == 0, where + " header even");
        eq(h.get("big"), (1L << 40) + i, where + " header big");
        eq(h.get("ratio"), i / 4.0, where + " header ratio");
        Object nested = h.get("nested");
        check(nested instanceof Map, where + " header nested type");
        eq(((Map<?, ?>) nested).get("n"), i * 3, where + " header nested.n");
        Object list = h.get("list");
        check(list instanceof List, where + " header list type");
        List<?> l = (List<?>) list;
        eq(l.size(), 3, where + " header list size");
        eq(l.get(0), i, where + " header list[0]");
        eq(str(l.get(1)), "x", where + " header list[1]");
        eq(l.get(2), true, where + " header list[2]");
    }

    public static void main(String[] args) {
        if (args.length < 2) {
            System.err.println("usage: QuayInterop HOST PORT [nio]");
            System.exit(2);
        }
        try {
            run(args[0], Integer.parseInt(args[1]), args.length > 2 && args[2].equals("nio"));
            System.out.println("ALL OK");
            System.exit(0);
        } catch (Throwable t) {
            System.out.println("FAIL " + step + ": " + t);
            t.printStackTrace(System.out);
            System.out.flush();
            System.exit(1);
        }
    }

    static void run(String host, int port, boolean nio) throws Exception {
        ConnectionFactory cf = new ConnectionFactory();
        cf.setHost(host);
        cf.setPort(port);
        cf.setUsername("guest");
        cf.setPassword("guest");
        cf.setVirtualHost("/");
        cf.setAutomaticRecoveryEnabled(false);     // a broken broker must fail the test
        cf.setTopologyRecoveryEnabled(false);
        cf.setConnectionTimeout(10000);
        cf.setHandshakeTimeout(10000);
        cf.setShutdownTimeout(5000);
        if (nio) cf.useNio();
        cf.setExceptionHandler(new DefaultExceptionHandler() {
            @Override public void handleUnexpectedConnectionDriverException(Connection c, Throwable e) {
                asyncErrors.add("connection driver: " + e);
            }
            @Override public void handleReturnListenerException(Channel ch, Throwable e) {
                asyncErrors.add("return listener: " + e);
            }
            @Override public void handleConfirmListenerException(Channel ch, Throwable e) {
                asyncErrors.add("confirm listener: " + e);
            }
            @Override public void handleConsumerException(Channel ch, Throwable e, Consumer c,
                                                          String tag, String method) {
                asyncErrors.add("consumer " + method + ": " + e);
            }
        });

        // ---- connect -------------------------------------------------------------
        step = "connect";
        Connection conn = cf.newConnection("quay-interop");
        Map<String, Object> sp = conn.getServerProperties();
        System.out.println("# server product=" + sp.get("product") + " version=" + sp.get("version")
                + " frame_max=" + conn.getFrameMax() + " channel_max=" + conn.getChannelMax()
                + " heartbeat=" + conn.getHeartbeat() + (nio ? " (nio)" : " (blocking io)"));
        Object caps = sp.get("capabilities");
        check(caps instanceof Map, "server capabilities table missing");
        for (String cap : new String[] {"publisher_confirms", "basic.nack", "consumer_cancel_notify",
                                        "exchange_exchange_bindings", "connection.blocked"})
            eq(((Map<?, ?>) caps).get(cap), true, "capability " + cap);
        check(conn.isOpen(), "connection not open");
        ok("connect");

        // ---- topology --------------------------------------------------------------
        step = "declare";
        Channel ch = conn.createChannel();
        AMQP.Queue.DeclareOk dq = ch.queueDeclare("", false, true, false, null);   // exclusive
        String q = dq.getQueue();
        check(q.startsWith("amq.gen-"), "server-named queue should start with amq.gen-: " + q);
        eq(dq.getMessageCount(), 0, "declare-ok message count");
        eq(dq.getConsumerCount(), 0, "declare-ok consumer count");
        String ex = "quay-java-topic-" + System.nanoTime();
        ch.exchangeDeclare(ex, BuiltinExchangeType.TOPIC, false, true, null);
        ch.exchangeDeclarePassive(ex);
        ch.queueBind(q, ex, "quay.java.#");
        ok("declare");

        // ---- confirms + publish ------------------------------------------------------
        step = "publish-confirm";
        ch.confirmSelect();
        eq(ch.getNextPublishSeqNo(), 1L, "first publish seq no");
        final AtomicLong ackedUpTo = new AtomicLong(0);
        final AtomicInteger nacks = new AtomicInteger(0);
        ch.addConfirmListener(new ConfirmListener() {
            @Override public void handleAck(long tag, boolean multiple) {
                ackedUpTo.accumulateAndGet(tag, Math::max);
            }
            @Override public void handleNack(long tag, boolean multiple) {
                nacks.incrementAndGet();
            }
        });
        for (int i = 0; i < N; i++)
            ch.basicPublish(ex, KEY_PREFIX + (i % 7), false, propsFor(i),
                            ("java-" + i).getBytes(StandardCharsets.UTF_8));
        ch.waitForConfirmsOrDie(15000);
        eq(ch.getNextPublishSeqNo(), (long) N + 1, "next publish seq no");
        eq(ackedUpTo.get(), (long) N, "highest confirmed delivery tag");
        eq(nacks.get(), 0, "nacks");
        eq(ch.queueDeclarePassive(q).getMessageCount(), N, "queue depth after confirms");
        ok("publish-confirm " + N);

        // ---- consume with prefetch ------------------------------------------------------
        step = "consume";
        ch.basicQos(PREFETCH);
        final List<Integer> order = Collections.synchronizedList(new ArrayList<Integer>());
        final CountDownLatch firstWindow = new CountDownLatch(PREFETCH);
        final CountDownLatch all = new CountDownLatch(N);
        final CountDownLatch cancelled = new CountDownLatch(1);
        final AtomicBoolean ackEach = new AtomicBoolean(false);
        final AtomicReference<String> consumeOkTag = new AtomicReference<>();
        final CountDownLatch consumeOk = new CountDownLatch(1);
        final Channel cch = ch;
        String ctag = ch.basicConsume(q, false, "quay-java-consumer", new DefaultConsumer(ch) {
            int expect = 0;
            @Override public void handleConsumeOk(String tag) {
                consumeOkTag.set(tag);
                consumeOk.countDown();
            }
            @Override public void handleCancelOk(String tag) { cancelled.countDown(); }
            @Override public void handleDelivery(String tag, Envelope env, AMQP.BasicProperties p,
                                                 byte[] body) throws IOException {
                try {
                    int i = expect++;
                    eq(tag, "quay-java-consumer", "consumer tag");
                    eq(env.getDeliveryTag(), (long) i + 1, "delivery tag of message " + i);
                    eq(env.isRedeliver(), false, "redelivered flag of message " + i);
                    eq(env.getExchange(), ex, "exchange of message " + i);
                    eq(env.getRoutingKey(), KEY_PREFIX + (i % 7), "routing key of message " + i);
                    checkMessage(i, p, body);
                    order.add(i);
                } catch (Throwable t) {
                    asyncErrors.add(t.toString());
                }
                if (ackEach.get())
                    cch.basicAck(env.getDeliveryTag(), false);
                firstWindow.countDown();
                all.countDown();
            }
        });
        eq(ctag, "quay-java-consumer", "consume-ok tag");
        check(consumeOk.await(5, TimeUnit.SECONDS), "handleConsumeOk not called");
        eq(consumeOkTag.get(), "quay-java-consumer", "handleConsumeOk tag");
        check(firstWindow.await(10, TimeUnit.SECONDS), "first " + PREFETCH + " deliveries did not arrive");
        Thread.sleep(500);   // a broker ignoring basic.qos would now have sent more
        noAsyncErrors();
        eq(order.size(), PREFETCH, "deliveries while " + PREFETCH + " unacked (basic.qos)");
        ackEach.set(true);
        ch.basicAck(PREFETCH, true);   // ack the first window with multiple=true
        check(all.await(30, TimeUnit.SECONDS), "only " + order.size() + " of " + N + " delivered");
        noAsyncErrors();
        eq(order.size(), N, "delivered count");
        ch.basicCancel(ctag);
        check(cancelled.await(5, TimeUnit.SECONDS), "no basic.cancel-ok");
        AMQP.Queue.DeclareOk after = ch.queueDeclarePassive(q);
        eq(after.getMessageCount(), 0, "queue depth after consuming and acking");
        eq(after.getConsumerCount(), 0, "consumers after cancel");
        ok("consume " + N + " in order with qos " + PREFETCH);

        // ---- basic.get ---------------------------------------------------------------
        step = "basic-get";
        byte[] big = new byte[300000];   // > frame_max: several body frames
        new Random(42).nextBytes(big);
        AMQP.BasicProperties getProps = new AMQP.BasicProperties.Builder()
                .contentType("application/octet-stream").messageId("get-1").build();
        ch.basicPublish("", q, getProps, "get-1".getBytes(StandardCharsets.UTF_8));
        ch.basicPublish("", q, null, big);
        ch.waitForConfirmsOrDie(10000);
        GetResponse g1 = ch.basicGet(q, false);
        check(g1 != null, "basic.get returned get-empty on a queue with 2 messages");
        eq(new String(g1.getBody(), StandardCharsets.UTF_8), "get-1", "get body");
        eq(g1.getMessageCount(), 1, "get-ok message-count");
        eq(g1.getEnvelope().getDeliveryTag(), (long) N + 1, "get-ok delivery tag");
        eq(g1.getEnvelope().getExchange(), "", "get-ok exchange");
        eq(g1.getEnvelope().getRoutingKey(), q, "get-ok routing key");
        eq(g1.getEnvelope().isRedeliver(), false, "get-ok redelivered");
        eq(g1.getProps().getMessageId(), "get-1", "get message-id");
        eq(g1.getProps().getContentType(), "application/octet-stream", "get content-type");
        eq(g1.getProps().getHeaders(), null, "get headers (absent)");
        ch.basicAck(g1.getEnvelope().getDeliveryTag(), false);
        GetResponse g2 = ch.basicGet(q, true);
        check(g2 != null, "second basic.get returned get-empty");
        check(Arrays.equals(g2.getBody(), big), "300000-byte body differs (got " + g2.getBody().length + " bytes)");
        eq(g2.getMessageCount(), 0, "second get-ok message-count");
        eq(g2.getEnvelope().getDeliveryTag(), (long) N + 2, "second get-ok delivery tag");
        check(ch.basicGet(q, false) == null, "basic.get on empty queue did not return get-empty");
        ok("basic-get");

        // ---- mandatory return ------------------------------------------------------------
        step = "mandatory-return";
        final CountDownLatch returned = new CountDownLatch(1);
        final AtomicReference<String> ret = new AtomicReference<>();
        ch.addReturnListener(new ReturnListener() {
            @Override public void handleReturn(int code, String text, String exch, String key,
                                               AMQP.BasicProperties p, byte[] body) {
                ret.set(code + "|" + text + "|" + exch + "|" + key + "|" + p.getMessageId() + "|"
                        + new String(body, StandardCharsets.UTF_8));
                returned.countDown();
            }
        });
        AMQP.BasicProperties retProps = new AMQP.BasicProperties.Builder().messageId("ret-1").build();
        ch.basicPublish(ex, "unrouted.key", true, retProps, "nowhere".getBytes(StandardCharsets.UTF_8));
        ch.waitForConfirmsOrDie(10000);   // an unroutable message is still confirmed
        check(returned.await(5, TimeUnit.SECONDS), "no basic.return for a mandatory unroutable publish");
        eq(ret.get(), "312|NO_ROUTE|" + ex + "|unrouted.key|ret-1|nowhere", "basic.return");
        noAsyncErrors();
        ok("mandatory-return");

        // ---- channel error -----------------------------------------------------------------
        step = "channel-error";
        Channel bad = conn.createChannel();
        String missing = "quay-java-missing-" + System.nanoTime();
        try {
            bad.queueDeclarePassive(missing);
            throw new Failure("passive declare of a missing queue succeeded");
        } catch (IOException e) {
            Throwable cause = e.getCause();
            check(cause instanceof ShutdownSignalException, "cause is not ShutdownSignalException: " + cause);
            ShutdownSignalException sse = (ShutdownSignalException) cause;
            check(!sse.isHardError(), "expected a channel error, got a connection error: " + sse);
            check(!sse.isInitiatedByApplication(), "close should be initiated by the broker");
            Method reason = sse.getReason();
            check(reason instanceof AMQP.Channel.Close, "reason is not channel.close: " + reason);
            AMQP.Channel.Close close = (AMQP.Channel.Close) reason;
            eq(close.getReplyCode(), 404, "channel.close reply code");
            eq(close.getReplyText(), "NOT_FOUND - no queue '" + missing + "' in vhost '/'",
               "channel.close reply text");
            eq(close.getClassId(), 50, "channel.close class id");
            eq(close.getMethodId(), 10, "channel.close method id");
        }
        check(!bad.isOpen(), "channel still open after channel.close");
        check(conn.isOpen(), "connection closed by a channel error");
        check(ch.isOpen(), "other channel closed by a channel error");
        eq(ch.queueDeclarePassive(q).getMessageCount(), 0, "other channel still usable");
        Channel fresh = conn.createChannel();
        check(fresh.isOpen(), "new channel not open");
        fresh.queueDeclarePassive(q);
        ok("channel-error 404, connection survives");

        // ---- transactions -------------------------------------------------------------------
        step = "tx";
        fresh.txSelect();
        for (int i = 0; i < 2; i++)
            fresh.basicPublish("", q, null, ("rolled-back-" + i).getBytes(StandardCharsets.UTF_8));
        fresh.txRollback();
        for (int i = 0; i < 3; i++)
            fresh.basicPublish("", q, MessageProperties.PERSISTENT_BASIC, ("tx-" + i).getBytes(StandardCharsets.UTF_8));
        eq(ch.queueDeclarePassive(q).getMessageCount(), 0, "uncommitted messages visible");
        fresh.txCommit();
        // tx.commit-ok does not promise the messages already reached the queue
        // (RabbitMQ routes them asynchronously), so poll for the depth
        int depth = 0;
        for (long end = System.currentTimeMillis() + 5000; System.currentTimeMillis() < end; Thread.sleep(10))
            if ((depth = ch.queueDeclarePassive(q).getMessageCount()) >= 3) break;
        eq(depth, 3, "queue depth after tx.commit");
        for (int i = 0; i < 3; i++) {
            GetResponse r = ch.basicGet(q, true);
            check(r != null, "committed message " + i + " missing");
            eq(new String(r.getBody(), StandardCharsets.UTF_8), "tx-" + i, "committed message body");
            eq(r.getProps().getDeliveryMode(), 2, "committed message delivery mode");
        }
        check(ch.basicGet(q, true) == null, "rolled-back messages were delivered");
        ok("tx rollback + commit");

        // ---- clean close -------------------------------------------------------------------
        step = "close";
        fresh.close();
        check(!fresh.isOpen(), "channel open after close");
        eq(ch.queueDelete(q).getMessageCount(), 0, "queue.delete-ok message count");
        ch.exchangeDelete(ex);
        noAsyncErrors();
        ch.close();
        conn.close(5000);
        check(!conn.isOpen(), "connection open after close");
        ShutdownSignalException reason = conn.getCloseReason();
        check(reason != null && reason.isInitiatedByApplication(), "close not initiated by us: " + reason);
        noAsyncErrors();
        ok("close");
    }
}
