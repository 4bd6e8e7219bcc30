// libFuzzer target: arbitrary bytes at the frame decoder and, through it, at the request
// dispatcher of a Service, and at the TCPStore wire (decoder and the worker store behind it). The
// first input byte picks the scenario so both the handshake and the authenticated ops are
// reached. Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address).
#include <cstddef>
#include <cstdint>
#include <string>

#include "../rendezvous/service/fake_transport.h"
#include "rendezvous/protocol/auth.h"
#include "rendezvous/protocol/message.h"
#include "rendezvous/protocol/tcpstore_wire.h"
#include "rendezvous/service/service.h"

using namespace ctrun::rendezvous;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const std::size_t n = size - 1;

  // The decoder alone, fed in slices whose sizes come from the mode byte.
  {
    FrameDecoder decoder(1 << 16);
    const std::size_t slice = 1 + (mode & 0x0f);
    for (std::size_t pos = 0; pos < n; pos += slice) {
      decoder.feed(bytes + pos, std::min(slice, n - pos));
      while (true) {
        auto frame = decoder.next();
        if (!frame || !frame.value()) break;
        if (!frame.value()->is_object()) __builtin_trap();
      }
    }
  }

  // The dispatcher: one connection, optionally past hello, then the fuzz bytes.
  ManualClock clock;
  testing::FakeTransport transport;
  ServiceOptions options;
  options.max_frame_bytes = 1 << 16;
  options.random = [](std::size_t k) { return std::string(k, 'n'); };
  if (mode & 0x40) options.token = "token";
  Service service(options, clock, transport);
  service.on_connect(1, "fuzz");
  if (mode & 0x80) {
    Json hello{{"op", "hello"}, {"id", 0}, {"version", kProtocolVersion}, {"job", "j"}};
    if (options.token) {
      hello["proof"] = to_binary(client_proof(*options.token, std::string(kNonceBytes, 'n'), "j"));
    }
    const std::string frame = encode_frame(hello);
    service.on_data(1, frame.data(), frame.size());
  }
  service.on_data(1, bytes, n);
  clock.advance(std::chrono::seconds(mode & 0x3f));
  service.tick();
  if (!transport.closed.count(1)) service.on_disconnect(1);

  // The TCPStore wire: the decoder alone, then a worker-store listener that gets the bytes from
  // a torch client (either numbering: the mode byte may put VALIDATE first).
  {
    tcpstore::Limits limits;
    limits.max_request_bytes = 1 << 16;
    tcpstore::Decoder decoder(limits);
    const std::size_t slice = 1 + (mode & 0x0f);
    for (std::size_t pos = 0; pos < n; pos += slice) {
      decoder.feed(bytes + pos, std::min(slice, n - pos));
      while (true) {
        auto req = decoder.next();
        if (!req || !req.value()) break;
        for (const auto& k : req.value()->keys) {
          if (k.size() > limits.max_key_bytes) __builtin_trap();
        }
      }
    }
  }
  ServiceOptions store_options = options;
  store_options.worker_store_job = "j";
  testing::FakeTransport store_transport;
  Service store_service(store_options, clock, store_transport);
  store_transport.raw.insert(1);
  store_transport.raw.insert(2);
  store_service.on_connect(1, "torch");
  store_service.on_connect(2, "torch");
  if (mode & 0x80) {
    const std::string validate = tcpstore::encode_validate();
    store_service.on_data(1, validate.data(), validate.size());
  }
  store_service.on_data(1, bytes, n);
  store_service.on_data(2, bytes, n / 2);  // a second client, cut short
  clock.advance(std::chrono::seconds(mode & 0x3f));
  store_service.tick();
  for (ConnectionId id : {1, 2}) {
    if (!store_transport.closed.count(id)) store_service.on_disconnect(id);
  }
  return 0;
}
