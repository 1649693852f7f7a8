package deductor.bench;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;

import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.data.redis.connection.RedisConnection;
import org.springframework.data.redis.connection.ReturnType;
import org.springframework.data.redis.core.RedisCallback;
import org.springframework.data.redis.core.StringRedisTemplate;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.support.SendResult;
import org.springframework.stereotype.Component;
import tools.jackson.databind.json.JsonMapper;

/**
 * The Spring side of deductor-bench's comparison (issue 14): order events in,
 * the reference script (the article's four-key deduct script) per promotion
 * line, one outcome per event out, offsets committed by the container after
 * the listener returns.
 *
 * <ul>
 *   <li>{@code bench.mode=record}: one record at a time, one script call and
 *       one blocking send per line/event.</li>
 *   <li>{@code bench.mode=batch}: what a Spring team tuning for throughput
 *       deploys: a batch listener, every line's call of the batch in one
 *       pipelined round trip, the outcomes sent asynchronously and awaited
 *       together before the batch's offsets are committed.</li>
 * </ul>
 *
 * It does less than deductor: no validation, no records, no memos, and a
 * refund gets an outcome without any Redis work (the reference script has
 * no rollback), which favours this service in the comparison.
 */
@SpringBootApplication
public class ReferenceService {
    public static void main(String[] args) {
        SpringApplication.run(ReferenceService.class, args);
    }

    @JsonIgnoreProperties(ignoreUnknown = true)
    public record Line(String promotion_id, Long budget, Long stock) {}

    @JsonIgnoreProperties(ignoreUnknown = true)
    public record Event(String type, String event_id, String order_id, String customer_id,
                        List<Line> lines) {}

    /** The script, its arguments and the outcome JSON; shared by both listeners. */
    @Component
    public static class Reference {
        final StringRedisTemplate redis;
        final KafkaTemplate<String, String> kafka;
        final JsonMapper json;
        final String output;
        final String limit;
        /** Per-promotion limits over `limit` (bench.limits: "P=N,P2=N2"). */
        final Map<String, String> limits;
        final String ttl;
        final byte[] sha;

        Reference(StringRedisTemplate redis, KafkaTemplate<String, String> kafka,
                  @Value("${bench.output}") String output,
                  @Value("${bench.script}") String script,
                  @Value("${bench.limit:5}") long limit,
                  @Value("${bench.limits:}") String limits,
                  @Value("${bench.ttl-secs:86400}") long ttl) throws Exception {
            this.redis = redis;
            this.kafka = kafka;
            this.json = JsonMapper.builder().build();
            this.output = output;
            this.limit = Long.toString(limit);
            Map<String, String> m = new java.util.HashMap<>();
            for (String kv : limits.split(",")) {
                int eq = kv.indexOf('=');
                if (eq > 0) {
                    m.put(kv.substring(0, eq).trim(), Long.toString(Long.parseLong(kv.substring(eq + 1).trim())));
                }
            }
            this.limits = m;
            this.ttl = Long.toString(ttl);
            byte[] body = Files.readAllBytes(Path.of(script));
            String s = redis.execute((RedisCallback<String>) c -> c.scriptingCommands().scriptLoad(body));
            this.sha = s.getBytes(StandardCharsets.UTF_8);
        }

        Event parse(String value) {
            return json.readValue(value, Event.class);
        }

        /** KEYS budget:{P}, stock:{P}, userLimit:{P}:{C}, idem:{event}:{P}; ARGV amount, quantity, limit, ttl. */
        Object call(RedisConnection c, Event e, Line l) {
            String p = l.promotion_id();
            byte[][] kv = {
                bytes("budget:{" + p + "}"),
                bytes("stock:{" + p + "}"),
                bytes("userLimit:{" + p + "}:" + e.customer_id()),
                bytes("idem:{" + p + "}:" + e.event_id()),
                bytes(Long.toString(l.budget() == null ? 0 : l.budget())),
                bytes(Long.toString(l.stock() == null ? 1 : l.stock())),
                bytes(limits.getOrDefault(p, limit)),
                bytes(ttl),
            };
            return c.scriptingCommands().evalSha(sha, ReturnType.INTEGER, 4, kv);
        }

        /** The outcome of an event from its lines' replies (1 deducted, 0 duplicate, <0 rejected). */
        String outcome(Event e, List<Object> replies) {
            if ("OrderRefunded".equals(e.type())) {
                return json.writeValueAsString(Map.of("type", "RollbackApplied", "event_id", e.event_id()));
            }
            for (Object r : replies) {
                long v = (Long) r;
                if (v < 0) {
                    String reason = v == -1 ? "budget_exhausted" : v == -2 ? "stock_insufficient" : "user_limit_reached";
                    return json.writeValueAsString(Map.of("type", "DeductRejected", "event_id", e.event_id(), "reason", reason));
                }
            }
            return json.writeValueAsString(Map.of("type", "DeductAccepted", "event_id", e.event_id()));
        }

        CompletableFuture<SendResult<String, String>> send(Event e, String outcome) {
            return kafka.send(output, e.order_id(), outcome);
        }

        static byte[] bytes(String s) {
            return s.getBytes(StandardCharsets.UTF_8);
        }
    }

    /** One pipelined round trip and asynchronous sends per poll. */
    @Component
    @ConditionalOnProperty(name = "bench.mode", havingValue = "batch")
    public static class BatchListener {
        final Reference ref;

        BatchListener(Reference ref) {
            this.ref = ref;
        }

        @KafkaListener(topics = "${bench.input}", batch = "true")
        public void onBatch(List<ConsumerRecord<String, String>> records) {
            List<Event> events = new ArrayList<>(records.size());
            for (ConsumerRecord<String, String> r : records) {
                events.add(ref.parse(r.value()));
            }
            List<Object> replies = ref.redis.executePipelined((RedisCallback<Object>) c -> {
                for (Event e : events) {
                    if ("OrderPlaced".equals(e.type())) {
                        for (Line l : e.lines()) {
                            ref.call(c, e, l);
                        }
                    }
                }
                return null;
            });
            List<CompletableFuture<SendResult<String, String>>> sends = new ArrayList<>(events.size());
            int at = 0;
            for (Event e : events) {
                int n = "OrderPlaced".equals(e.type()) ? e.lines().size() : 0;
                sends.add(ref.send(e, ref.outcome(e, replies.subList(at, at + n))));
                at += n;
            }
            CompletableFuture.allOf(sends.toArray(CompletableFuture[]::new)).join();
        }
    }

    /** One script call per line and one blocking send per record. */
    @Component
    @ConditionalOnProperty(name = "bench.mode", havingValue = "record")
    public static class RecordListener {
        final Reference ref;

        RecordListener(Reference ref) {
            this.ref = ref;
        }

        @KafkaListener(topics = "${bench.input}", batch = "false")
        public void onRecord(ConsumerRecord<String, String> record) throws Exception {
            Event e = ref.parse(record.value());
            List<Object> replies = new ArrayList<>();
            if ("OrderPlaced".equals(e.type())) {
                for (Line l : e.lines()) {
                    replies.add(ref.redis.execute((RedisCallback<Object>) c -> ref.call(c, e, l)));
                }
            }
            ref.send(e, ref.outcome(e, replies)).get();
        }
    }
}
