// The Java side of the CORE captures (tests/keys/captures/README.md): connect one JMS connection
// through the Artemis client (artemis-jms-client-all 2.40.0) to the capture server and say how it
// ended. Compiled with javac at capture time by capture_core.py; not part of the build.
//
//   java -cp artemis-jms-client-all-2.40.0.jar:. CoreCapture URL USER PASSWORD CLIENT_ID
//
// CLIENT_ID "-" leaves the factory without a client ID (the first CREATESESSION_V2 then carries
// none: the NULL key); "utf16:" + hex gives it as UTF-16 code units (a NUL cannot be an
// argument); USER "-" connects without credentials.

import javax.jms.Connection;
import javax.jms.JMSException;
import org.apache.activemq.artemis.jms.client.ActiveMQConnectionFactory;

public class CoreCapture {
    public static void main(String[] args) {
        String url = args[0];
        String user = args[1].equals("-") ? null : args[1];
        String password = args[2].equals("-") ? null : args[2];
        String clientId = args[3].equals("-") ? null : args[3];
        if (clientId != null && clientId.startsWith("utf16:")) {
            StringBuilder units = new StringBuilder();
            for (int i = 6; i + 4 <= clientId.length(); i += 4) {
                units.append((char) Integer.parseInt(clientId.substring(i, i + 4), 16));
            }
            clientId = units.toString();
        }
        ActiveMQConnectionFactory factory = new ActiveMQConnectionFactory(url, user, password);
        if (clientId != null) {
            factory.setClientID(clientId);
        }
        long start = System.nanoTime();
        try (Connection connection = factory.createConnection()) {
            System.out.println("connected");
        } catch (JMSException e) {
            for (Throwable t = e; t != null; t = t.getCause()) {
                System.out.println("exception " + t.getClass().getName() + ": " + t.getMessage());
            }
        } finally {
            System.out.println("elapsed_ms " + (System.nanoTime() - start) / 1_000_000);
            factory.close();
        }
    }
}
