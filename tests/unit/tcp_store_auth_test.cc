// TcpStoreServer with a per-job secret: signed clients work (including parked
// gets), a client without the secret or with another one is refused and
// reported, and a raw frame with a made-up tag gets no answer.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kTimeout{10000};
const std::string kSecret = "0123456789abcdef0123456789abcdef";

struct Rejections {
  std::mutex mutex;
  std::vector<std::string> messages;
  size_t count() {
    std::lock_guard<std::mutex> lock(mutex);
    return messages.size();
  }
};

TcpStoreServer::Options signed_options(Rejections& rejections) {
  TcpStoreServer::Options o;
  o.secret = kSecret;
  o.on_reject = [&rejections](const std::string& message) {
    std::lock_guard<std::mutex> lock(rejections.mutex);
    rejections.messages.push_back(message);
  };
  return o;
}

TEST(TcpStoreAuth, SignedClientsWorkIncludingParkedGets) {
  Rejections rejections;
  TcpStoreServer server(signed_options(rejections));
  auto a = connect_tcp_store("127.0.0.1", server.port(), kTimeout, kSecret);
  auto b = connect_tcp_store("127.0.0.1", server.port(), kTimeout, kSecret);
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    b->set("k", to_bytes("v"));
  });
  EXPECT_EQ(to_string(a->get("k", kTimeout)), "v");  // parked, then answered
  setter.join();
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(b->add("n", 3), 5);
  for (int i = 0; i < 50; ++i) a->set("x", to_bytes(std::to_string(i)));  // counters advance
  EXPECT_EQ(to_string(b->get("x", kTimeout)), "49");
  EXPECT_TRUE(a->erase("x"));
  EXPECT_EQ(rejections.count(), 0u);
}

TEST(TcpStoreAuth, ClientsWithoutTheSecretAreRefusedAndReported) {
  Rejections rejections;
  TcpStoreServer server(signed_options(rejections));
  auto good = connect_tcp_store("127.0.0.1", server.port(), kTimeout, kSecret);
  good->set("k", to_bytes("good"));

  auto wrong = connect_tcp_store("127.0.0.1", server.port(), kTimeout, "another-secret");
  EXPECT_THROW(wrong->set("k", to_bytes("evil")), RuntimeFault);
  // A client expecting no secret reads the nonce frame as its reply, so it
  // cannot tell it was refused; the server closed the connection unanswered.
  auto unsigned_client = connect_tcp_store("127.0.0.1", server.port(), kTimeout);
  try {
    unsigned_client->set("k", to_bytes("evil"));
  } catch (const RuntimeFault&) {
  }

  EXPECT_EQ(to_string(good->get("k", kTimeout)), "good");
  for (int i = 0; i < 100 && rejections.count() < 2; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(rejections.count(), 2u);
  EXPECT_NE(rejections.messages[0].find("rejected a connection from 127.0.0.1:"), std::string::npos)
      << rejections.messages[0];
}

TEST(TcpStoreAuth, AForgedFrameGetsNoAnswer) {
  // A raw connection that read the nonce but has no secret sends a request
  // with a made-up tag: the server closes the connection without answering.
  Rejections rejections;
  TcpStoreServer server(signed_options(rejections));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server.port()));
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  std::string frame(4 + 32 + 1, '\0');
  frame[0] = 33;  // body: 32 bytes of zero "tag", then op 4 (check, no keys)
  frame[4 + 32] = 4;
  ASSERT_EQ(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
  char buffer[64];
  ssize_t got = 0, n;
  // The nonce frame (20 bytes), then end of file: no reply to the forgery.
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) got += n;
  close(fd);
  EXPECT_EQ(got, 20);
  for (int i = 0; i < 100 && rejections.count() < 1; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(rejections.count(), 1u);
}

}  // namespace
}  // namespace kolo
