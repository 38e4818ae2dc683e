// The host list (-H) and where each rank runs.
#pragma once

#include <string>
#include <vector>

namespace kolo::launcher {

struct HostSlots {
  std::string name;
  int slots = 1;
};

// Parses "host1:slots,host2:slots" ("host" alone means 1 slot). Throws
// UsageError naming the bad entry: empty names, missing or non-positive slot
// counts, a host named twice.
std::vector<HostSlots> parse_host_list(const std::string& text);

// True for names that mean this machine: localhost, 127.x.x.x, ::1, and this
// host's name (`this_hostname`, short or fully qualified).
bool is_local_host(const std::string& name, const std::string& this_hostname);

// gethostname() of this machine.
std::string this_hostname();

// Where one rank runs and its place among the others.
struct Placement {
  int rank = 0;
  std::string host;  // as named in -H ("localhost" without -H)
  bool local = true;
  int local_rank = 0;  // index among the ranks of its host
  int local_size = 1;  // ranks on its host
  int cross_rank = 0;  // index of its host among the hosts that got ranks
  int cross_size = 1;  // hosts that got ranks
};

// Assigns ranks to slots in host order: the first host's slots get ranks 0..,
// then the next host's. Hosts left without ranks do not count in cross_size.
// Without -H (`hosts` empty) all `np` ranks run on this host (oversubscribing
// its cores is allowed). np == 0 means every slot. Throws UsageError when np
// exceeds the slots, or when two entries both name this machine.
std::vector<Placement> assign_ranks(const std::vector<HostSlots>& hosts, int np,
                                    const std::string& this_hostname);

}  // namespace kolo::launcher
