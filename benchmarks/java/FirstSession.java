/*
 * FirstSession: the time a real Artemis Java (JMS over CORE) client takes from createConnection to
 * a started session, through each of several URLs, in one JVM (the artemis group of
 * benchmarks/run.py compiles it with javac against artemis-jms-client-all and runs it).
 *
 *   java -cp CLIENT_JARS:DIR FirstSession USER PASSWORD WARMUP ROUNDS ID_PREFIX NAME=URL ...
 *
 * Each round visits every URL once, the order rotated by one each round; the first WARMUP rounds
 * are not timed (class loading, the JIT of this JVM). Per visit: a new ActiveMQConnectionFactory
 * with a client ID of its own (ID_PREFIX + NAME + "-" + a counter: set on the factory, so that it
 * travels in CREATESESSION_V2 and a CLIENT_ID router reads it), createConnection(), createSession(),
 * start(); then, untimed, the connection and the factory are closed. A URL with reconnectAttempts
 * other than 0 follows a CORE redirect (DISCONNECT_V3) to the broker it names.
 *
 * Prints one JSON line: {"rounds":R,"warmup":W,"ms":{"NAME":[...],...},"errors":{"NAME":N,...},
 * "last_error":{"NAME":"...",...}}; a failed visit counts as an error and has no time.
 */
import javax.jms.Connection;
import javax.jms.JMSException;
import javax.jms.Session;
import org.apache.activemq.artemis.jms.client.ActiveMQConnectionFactory;

public final class FirstSession {
    private FirstSession() {}

    public static void main(String[] args) {
        if (args.length < 6) {
            System.err.println("usage: FirstSession USER PASSWORD WARMUP ROUNDS ID_PREFIX NAME=URL ...");
            System.exit(2);
        }
        String user = args[0], password = args[1], prefix = args[4];
        int warmup = Integer.parseInt(args[2]), rounds = Integer.parseInt(args[3]);
        int paths = args.length - 5;
        String[] names = new String[paths], urls = new String[paths];
        for (int i = 0; i < paths; i++) {
            String spec = args[5 + i];
            int eq = spec.indexOf('=');
            names[i] = spec.substring(0, eq);
            urls[i] = spec.substring(eq + 1);
        }
        StringBuilder[] times = new StringBuilder[paths];
        int[] errors = new int[paths];
        String[] lastError = new String[paths];
        for (int i = 0; i < paths; i++) {
            times[i] = new StringBuilder();
            lastError[i] = "";
        }
        long seq = 0;
        for (int round = 0; round < warmup + rounds; round++) {
            for (int k = 0; k < paths; k++) {
                int p = (round + k) % paths;
                String clientId = prefix + names[p] + "-" + seq++;
                try {
                    double ms = once(urls[p], user, password, clientId);
                    if (round >= warmup) {
                        if (times[p].length() > 0) times[p].append(',');
                        times[p].append(String.format("%.3f", ms));
                    }
                } catch (JMSException | RuntimeException e) {
                    errors[p]++;
                    lastError[p] = String.valueOf(e);
                }
            }
        }
        StringBuilder out = new StringBuilder();
        out.append("{\"rounds\":").append(rounds).append(",\"warmup\":").append(warmup).append(",\"ms\":{");
        for (int i = 0; i < paths; i++) {
            out.append(i > 0 ? "," : "").append('"').append(names[i]).append("\":[").append(times[i]).append(']');
        }
        out.append("},\"errors\":{");
        for (int i = 0; i < paths; i++) {
            out.append(i > 0 ? "," : "").append('"').append(names[i]).append("\":").append(errors[i]);
        }
        out.append("},\"last_error\":{");
        for (int i = 0; i < paths; i++) {
            out.append(i > 0 ? "," : "").append('"').append(names[i]).append("\":\"").append(json(lastError[i])).append('"');
        }
        out.append("}}");
        System.out.println(out);
        System.exit(0);
    }

    /** Milliseconds from createConnection to a started session; closes both afterwards. */
    private static double once(String url, String user, String password, String clientId) throws JMSException {
        ActiveMQConnectionFactory factory = new ActiveMQConnectionFactory(url, user, password);
        try {
            factory.setClientID(clientId);
            long start = System.nanoTime();
            Connection connection = factory.createConnection();
            try {
                Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
                connection.start();
                double ms = (System.nanoTime() - start) / 1e6;
                session.close();
                return ms;
            } finally {
                connection.close();
            }
        } finally {
            factory.close();
        }
    }

    private static String json(String text) {
        StringBuilder out = new StringBuilder();
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') out.append('\\').append(c);
            else if (c < 0x20) out.append(' ');
            else out.append(c);
        }
        return out.toString();
    }
}
