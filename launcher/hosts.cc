// Host list parsing and rank placement (mpirun's "by slot" mapping).
#include "hosts.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>

#include "usage_error.h"

namespace kolo::launcher {
namespace {

const char* kHostListForm = "write host:slots entries separated by commas, e.g. -H a:2,b:2";
// Most slots one host may offer (keeps sums of slots within an int).
constexpr long kMaxSlots = 1000000;

std::string lower(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string short_name(const std::string& name) { return name.substr(0, name.find('.')); }

}  // namespace

std::vector<HostSlots> parse_host_list(const std::string& text) {
  std::vector<HostSlots> hosts;
  if (text.empty()) throw UsageError(std::string("-H is empty: ") + kHostListForm);
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string entry = text.substr(start, comma == std::string::npos ? comma : comma - start);
    const std::string where = "-H '" + text + "': entry '" + entry + "' ";
    if (entry.empty()) throw UsageError(where + "is empty; " + kHostListForm);
    HostSlots host;
    // The last ':' separates the slots, so a bracketed IPv6 address "[::1]:2" works.
    size_t colon = entry.rfind(':');
    bool bracketed = !entry.empty() && entry[0] == '[';
    if (colon == std::string::npos || (bracketed && colon < entry.find(']'))) {
      host.name = entry;
    } else {
      host.name = entry.substr(0, colon);
      std::string slots = entry.substr(colon + 1);
      if (slots.empty()) throw UsageError(where + "has no slot count after ':'; " + kHostListForm);
      errno = 0;
      char* end = nullptr;
      long value = std::strtol(slots.c_str(), &end, 10);
      if (*end != '\0' || (errno != 0 && errno != ERANGE)) {
        throw UsageError(where + "has slot count '" + slots + "', not a whole number; " +
                         kHostListForm);
      }
      if (errno == ERANGE || value > kMaxSlots) {
        throw UsageError(where + "has slot count " + slots + ": too large; at most " +
                         std::to_string(kMaxSlots) + " slots per host");
      }
      if (value < 1) {
        throw UsageError(where + "has " + slots +
                         " slots; a host needs at least 1 (or leave it out)");
      }
      host.slots = static_cast<int>(value);
    }
    if (bracketed && host.name.back() == ']') host.name = host.name.substr(1, host.name.size() - 2);
    if (host.name.empty()) throw UsageError(where + "has no host name; " + kHostListForm);
    if (!bracketed && host.name.find(':') != std::string::npos) {
      // "localhost:2:3", or an IPv6 address without brackets.
      throw UsageError(where +
                       "has more than one ':'; write host:slots (an IPv6 address in "
                       "brackets, e.g. [::1]:2)");
    }
    for (const auto& other : hosts) {
      if (lower(other.name) == lower(host.name)) {
        throw UsageError("-H '" + text + "': host '" + host.name +
                         "' is named twice; name it once with the sum of its slots");
      }
    }
    hosts.push_back(host);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return hosts;
}

bool is_local_host(const std::string& name, const std::string& this_hostname) {
  std::string n = lower(name);
  if (n == "localhost" || n == "::1" || n == "localhost.localdomain") return true;
  if (n.rfind("127.", 0) == 0) return true;
  std::string self = lower(this_hostname);
  if (self.empty()) return false;
  return n == self || (short_name(n) == short_name(self) &&
                       (n.find('.') == std::string::npos || self.find('.') == std::string::npos));
}

std::string this_hostname() {
  char buffer[HOST_NAME_MAX + 1] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0) return "localhost";
  return buffer;
}

std::vector<Placement> assign_ranks(const std::vector<HostSlots>& hosts, int np,
                                    const std::string& this_hostname) {
  if (hosts.empty()) {
    if (np < 1) throw UsageError("-np " + std::to_string(np) + ": must be at least 1");
    std::vector<Placement> placements(static_cast<size_t>(np));
    for (int r = 0; r < np; ++r) {
      auto& p = placements[static_cast<size_t>(r)];
      p.rank = r;
      p.host = "localhost";
      p.local = true;
      p.local_rank = r;
      p.local_size = np;
      p.cross_rank = 0;
      p.cross_size = 1;
    }
    return placements;
  }

  std::string local_name;
  int total_slots = 0;
  std::string list;
  for (const auto& host : hosts) {
    total_slots += host.slots;
    list += (list.empty() ? "" : ",") + host.name + ":" + std::to_string(host.slots);
    if (is_local_host(host.name, this_hostname)) {
      if (!local_name.empty()) {
        throw UsageError("-H " + list + ": '" + local_name + "' and '" + host.name +
                         "' both name this machine; name it once with the sum of its slots");
      }
      local_name = host.name;
    }
  }
  if (np == 0) np = total_slots;
  if (np > total_slots) {
    throw UsageError("-np " + std::to_string(np) + " is more than the " +
                     std::to_string(total_slots) + " slots of -H " + list +
                     ": lower -np or add slots (host:slots)");
  }

  std::vector<Placement> placements;
  int cross_rank = 0;
  for (const auto& host : hosts) {
    int remaining = np - static_cast<int>(placements.size());
    if (remaining <= 0) break;
    int here = std::min(host.slots, remaining);
    for (int i = 0; i < here; ++i) {
      Placement p;
      p.rank = static_cast<int>(placements.size());
      p.host = host.name;
      p.local = is_local_host(host.name, this_hostname);
      p.local_rank = i;
      p.local_size = here;
      p.cross_rank = cross_rank;
      placements.push_back(p);
    }
    ++cross_rank;
  }
  for (auto& p : placements) p.cross_size = cross_rank;
  return placements;
}

}  // namespace kolo::launcher
