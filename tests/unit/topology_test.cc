// detect_topology(): every launcher source, their precedence, the store
// address, job ids and the errors for inconsistent values.
#include "kolo/core/topology.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <string>

#include "kolo/core/errors.h"

namespace kolo {
namespace {

using Vars = std::map<std::string, std::string>;

Topology detect(const Vars& vars) {
  return detect_topology(map_env(vars), Config::load(map_env(vars)));
}

// The ContractError message of detecting `vars`, or "" when it succeeds.
std::string detect_error(const Vars& vars) {
  try {
    detect(vars);
  } catch (const ContractError& e) {
    return e.what();
  }
  return "";
}

void expect_placement(const Topology& t, int rank, int size, int local_rank, int local_size,
                      int cross_rank, int cross_size) {
  EXPECT_EQ(t.rank, rank);
  EXPECT_EQ(t.size, size);
  EXPECT_EQ(t.local_rank, local_rank);
  EXPECT_EQ(t.local_size, local_size);
  EXPECT_EQ(t.cross_rank, cross_rank);
  EXPECT_EQ(t.cross_size, cross_size);
}

const Vars kKolorun = {{"KOLO_RANK", "3"},
                       {"KOLO_SIZE", "4"},
                       {"KOLO_LOCAL_RANK", "1"},
                       {"KOLO_LOCAL_SIZE", "2"},
                       {"KOLO_CROSS_RANK", "1"},
                       {"KOLO_CROSS_SIZE", "2"},
                       {"KOLO_STORE_ADDR", "127.0.0.1"},
                       {"KOLO_STORE_PORT", "4242"},
                       {"KOLO_JOB_ID", "job42"}};
const Vars kOpenMpi = {{"OMPI_COMM_WORLD_RANK", "2"},
                       {"OMPI_COMM_WORLD_SIZE", "3"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                       {"PMIX_NAMESPACE", "1226178561"},
                       {"OMPI_MCA_orte_hnp_uri", "1226178560.0;tcp://192.0.2.2:33041"}};
const Vars kPmi = {
    {"PMI_RANK", "1"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}};
const Vars kSlurm = {{"SLURM_PROCID", "5"},  {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"},
                     {"SLURM_NNODES", "4"},  {"SLURM_TASKS_PER_NODE", "2(x4)"},
                     {"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "3"}};
const Vars kTorchrun = {{"RANK", "1"},
                        {"WORLD_SIZE", "2"},
                        {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "2"},
                        {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", "29500"}};

Vars merged(std::initializer_list<Vars> parts) {
  Vars out;
  for (const auto& part : parts) out.insert(part.begin(), part.end());
  return out;
}

TEST(Topology, NoLauncherIsAWorldOfOne) {
  Topology t = detect({{"PATH", "/bin"}, {"MASTER_ADDR", "somewhere"}});
  EXPECT_EQ(t.source, "none");
  expect_placement(t, 0, 1, 0, 1, 0, 1);
  EXPECT_TRUE(t.placement_known);
  EXPECT_TRUE(t.store_host.empty());  // a world of one needs no store
  EXPECT_FALSE(t.serve_store);
  EXPECT_EQ(t.job_id, "single-" + std::to_string(getpid()));
}

TEST(Topology, Kolorun) {
  Topology t = detect(kKolorun);
  EXPECT_EQ(t.source, "kolorun");
  expect_placement(t, 3, 4, 1, 2, 1, 2);
  EXPECT_TRUE(t.placement_known);
  EXPECT_EQ(t.store_host, "127.0.0.1");
  EXPECT_EQ(t.store_port, 4242);
  EXPECT_FALSE(t.serve_store);
  EXPECT_EQ(t.job_id, "job42");
}

TEST(Topology, KolorunWithoutPlacementLeavesItToTheRuntime) {
  Topology t = detect({{"KOLO_RANK", "1"}, {"KOLO_SIZE", "3"}});
  EXPECT_FALSE(t.placement_known);
  EXPECT_EQ(t.rank, 1);
  EXPECT_EQ(t.size, 3);
  // Only local given, covering the whole world: a single host.
  t = detect(
      {{"KOLO_RANK", "1"}, {"KOLO_SIZE", "3"}, {"KOLO_LOCAL_RANK", "1"}, {"KOLO_LOCAL_SIZE", "3"}});
  EXPECT_TRUE(t.placement_known);
  expect_placement(t, 1, 3, 1, 3, 0, 1);
}

TEST(Topology, OpenMpi) {
  Topology t = detect(kOpenMpi);
  EXPECT_EQ(t.source, "openmpi");
  expect_placement(t, 2, 3, 2, 3, 0, 1);
  EXPECT_TRUE(t.placement_known);
  EXPECT_TRUE(t.store_host.empty());
  EXPECT_EQ(t.job_id, "ompi-1226178561");
  // Without PMIX_NAMESPACE the job id comes from the HNP URI.
  Vars older = kOpenMpi;
  older.erase("PMIX_NAMESPACE");
  EXPECT_EQ(detect(older).job_id, "ompi-1226178560.0");
  // Several hosts: OpenMPI does not give the host index, the runtime finds it.
  older["OMPI_COMM_WORLD_SIZE"] = "6";
  EXPECT_FALSE(detect(older).placement_known);
}

TEST(Topology, MpichPmi) {
  Topology t = detect(kPmi);
  EXPECT_EQ(t.source, "pmi");
  EXPECT_EQ(t.rank, 1);
  EXPECT_EQ(t.size, 4);
  EXPECT_FALSE(t.placement_known);  // 2 of 4 ranks here: host index unknown
  t = detect(
      {{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"PMI_LOCAL_RANK", "0"}, {"PMI_LOCAL_SIZE", "2"}});
  expect_placement(t, 0, 2, 0, 2, 0, 1);
  EXPECT_TRUE(t.placement_known);
  EXPECT_EQ(t.job_id, "pmi-ppid" + std::to_string(getppid()));
}

TEST(Topology, Slurm) {
  Topology t = detect(kSlurm);
  EXPECT_EQ(t.source, "slurm");
  expect_placement(t, 5, 8, 1, 2, 2, 4);
  EXPECT_TRUE(t.placement_known);
  EXPECT_EQ(t.job_id, "slurm-77.3");
  // Uneven task lists: node 3 of "3,2(x2),1" runs 1 task.
  Vars uneven = kSlurm;
  uneven["SLURM_PROCID"] = "7";
  uneven["SLURM_LOCALID"] = "0";
  uneven["SLURM_NODEID"] = "3";
  uneven["SLURM_TASKS_PER_NODE"] = "3,2(x2),1";
  expect_placement(detect(uneven), 7, 8, 0, 1, 3, 4);
  // The step's list wins over the job's.
  uneven["SLURM_STEP_TASKS_PER_NODE"] = "2(x4)";
  uneven["SLURM_LOCALID"] = "1";
  expect_placement(detect(uneven), 7, 8, 1, 2, 3, 4);
  uneven["SLURM_STEP_TASKS_PER_NODE"] = "2(x3)";  // no entry for node 3
  EXPECT_NE(detect_error(uneven).find("SLURM_STEP_TASKS_PER_NODE=\"2(x3)\""), std::string::npos);
}

TEST(Topology, TorchrunStyle) {
  Topology t = detect(kTorchrun);
  EXPECT_EQ(t.source, "torchrun");
  expect_placement(t, 1, 2, 1, 2, 0, 1);
  EXPECT_TRUE(t.placement_known);
  EXPECT_EQ(t.store_host, "127.0.0.1");
  EXPECT_EQ(t.store_port, 29500);
  EXPECT_FALSE(t.serve_store);
  EXPECT_EQ(t.job_id, "torchrun-127.0.0.1-29500");
  Vars rank0 = kTorchrun;
  rank0["RANK"] = "0";
  rank0["LOCAL_RANK"] = "0";
  EXPECT_TRUE(detect(rank0).serve_store);
  // Two nodes of two: host index from GROUP_RANK, host count from the sizes.
  Vars two_nodes = merged({{{"WORLD_SIZE", "4"}, {"RANK", "3"}, {"GROUP_RANK", "1"}}, kTorchrun});
  expect_placement(detect(two_nodes), 3, 4, 1, 2, 1, 2);
  // Only RANK and WORLD_SIZE (set by hand): placement computed later.
  EXPECT_FALSE(detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).placement_known);
  // RANK alone is not a launch (RANK is a common name).
  EXPECT_EQ(detect({{"RANK", "3"}}).source, "none");
}

TEST(Topology, PrecedenceIsKolorunOpenMpiPmiSlurmTorchrun) {
  Vars all = merged({kKolorun, kOpenMpi, kPmi, kSlurm, kTorchrun});
  EXPECT_EQ(detect(all).source, "kolorun");
  for (const auto& name : {"KOLO_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE",
                           "KOLO_CROSS_RANK", "KOLO_CROSS_SIZE"}) {
    all.erase(name);
  }
  // KOLO_STORE_* and KOLO_JOB_ID stay and apply to any source.
  Topology t = detect(all);
  EXPECT_EQ(t.source, "openmpi");
  EXPECT_EQ(t.store_port, 4242);
  EXPECT_EQ(t.job_id, "job42");
  all.erase("OMPI_COMM_WORLD_RANK");
  all.erase("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(detect(all).source, "pmi");
  all.erase("PMI_RANK");
  all.erase("PMI_SIZE");
  EXPECT_EQ(detect(all).source, "slurm");
  all.erase("SLURM_PROCID");
  EXPECT_EQ(detect(all).source, "torchrun");
  all.erase("RANK");
  EXPECT_EQ(detect(all).source, "none");
}

TEST(Topology, KoloStoreOverridesMasterAddr) {
  Vars vars = merged({{{"KOLO_STORE_ADDR", "10.1.1.1"}, {"KOLO_STORE_PORT", "555"}}, kTorchrun});
  vars["RANK"] = "0";
  vars["LOCAL_RANK"] = "0";
  Topology t = detect(vars);
  EXPECT_EQ(t.store_host, "10.1.1.1");
  EXPECT_EQ(t.store_port, 555);
  EXPECT_FALSE(t.serve_store);  // someone else serves it
}

// torchrun >= 2.4's agent store (TORCHELASTIC_USE_AGENT_STORE=True) or
// KOLO_STORE=c10d: a c10d store at MASTER_ADDR:MASTER_PORT that no rank serves.
TEST(Topology, AgentStoreIsAC10dStoreNobodyServes) {
  Vars rank0 = kTorchrun;
  rank0["RANK"] = "0";
  rank0["LOCAL_RANK"] = "0";
  EXPECT_EQ(detect(rank0).store_kind, "kolo");
  Vars agent = merged({{{"TORCHELASTIC_USE_AGENT_STORE", "True"}}, rank0});
  Topology t = detect(agent);
  EXPECT_EQ(t.store_kind, "c10d");
  EXPECT_FALSE(t.serve_store);
  EXPECT_EQ(t.store_host, "127.0.0.1");
  EXPECT_EQ(t.store_port, 29500);
  // KOLO_STORE=kolo keeps kolo's own store (rank 0 serves it); "False" is no agent store.
  EXPECT_TRUE(detect(merged({{{"KOLO_STORE", "kolo"}}, agent})).serve_store);
  EXPECT_EQ(detect(merged({{{"TORCHELASTIC_USE_AGENT_STORE", "False"}}, rank0})).store_kind,
            "kolo");
  EXPECT_EQ(detect(merged({{{"KOLO_STORE", "c10d"}}, rank0})).store_kind, "c10d");
  // Under kolorun the variable, inherited from an outer torchrun, means nothing.
  EXPECT_EQ(detect(merged({{{"TORCHELASTIC_USE_AGENT_STORE", "True"}}, kKolorun})).store_kind,
            "kolo");
  // KOLO_STORE=c10d under kolorun, whose store is kolo's own: refused at
  // once, not after a c10d client's retries for the whole timeout.
  const std::string under_kolorun = detect_error(merged({{{"KOLO_STORE", "c10d"}}, kKolorun}));
  EXPECT_NE(under_kolorun.find("but kolorun serves kolo's own store at 127.0.0.1:4242"),
            std::string::npos)
      << under_kolorun;
  EXPECT_NE(under_kolorun.find("leave KOLO_STORE unset"), std::string::npos) << under_kolorun;
  // c10d without an address says which variables to set.
  const std::string error =
      detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"KOLO_STORE", "c10d"}});
  EXPECT_NE(error.find("KOLO_STORE=c10d"), std::string::npos) << error;
  EXPECT_NE(error.find("MASTER_ADDR and MASTER_PORT"), std::string::npos) << error;
  EXPECT_NE(detect_error({{"KOLO_STORE", "tcp"}}), "");
}

TEST(Topology, SlurmWithMasterAddrServesTheStoreFromRankZero) {
  Vars vars = merged({{{"MASTER_ADDR", "node1"}, {"MASTER_PORT", "6000"}}, kSlurm});
  vars["SLURM_PROCID"] = "0";
  vars["SLURM_LOCALID"] = "0";
  vars["SLURM_NODEID"] = "0";
  Topology t = detect(vars);
  EXPECT_EQ(t.source, "slurm");
  EXPECT_EQ(t.store_host, "node1");
  EXPECT_TRUE(t.serve_store);
}

TEST(Topology, JobIdsAreSafeNames) {
  Topology t = detect({{"KOLO_JOB_ID", "a/b;c d"}});
  EXPECT_EQ(t.job_id, "a_b_c_d");
  Topology long_id = detect({{"KOLO_JOB_ID", std::string(200, 'x') + "1"}});
  Topology other_id = detect({{"KOLO_JOB_ID", std::string(200, 'x') + "2"}});
  EXPECT_LE(long_id.job_id.size(), 64u);
  EXPECT_NE(long_id.job_id, other_id.job_id);
}

TEST(Topology, InconsistentValuesNameTheVariable) {
  auto expect_error = [](const Vars& vars, const std::string& needle) {
    std::string message = detect_error(vars);
    EXPECT_NE(message.find(needle), std::string::npos)
        << "expected '" << needle << "' in: '" << message << "'";
  };
  expect_error({{"OMPI_COMM_WORLD_RANK", "two"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
               "OMPI_COMM_WORLD_RANK=\"two\" is not a whole number");
  expect_error({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
               "OMPI_COMM_WORLD_RANK=4 is not in [0, OMPI_COMM_WORLD_SIZE=4)");
  expect_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}, "PMI_SIZE=0 is not in [1, 16777216]");
  // Above the cap, the message names the range, not only its lower end.
  expect_error({{"KOLO_RANK", "0"}, {"KOLO_SIZE", "16777217"}},
               "KOLO_SIZE=16777217 is not in [1, 16777216]");
  expect_error({{"SLURM_PROCID", "1"}}, "SLURM_PROCID is set but SLURM_NTASKS is not");
  expect_error({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2 "}},
               "SLURM_NTASKS=\"2 \" is not a whole number");
  expect_error({{"KOLO_SIZE", "2"}}, "KOLO_SIZE is set but KOLO_RANK is not");
  expect_error({{"KOLO_RANK", "0"}, {"KOLO_SIZE", "2"}, {"KOLO_LOCAL_RANK", "0"}},
               "KOLO_LOCAL_RANK is set but KOLO_LOCAL_SIZE is not");
  expect_error(
      {{"KOLO_RANK", "0"}, {"KOLO_SIZE", "2"}, {"KOLO_LOCAL_RANK", "2"}, {"KOLO_LOCAL_SIZE", "2"}},
      "KOLO_LOCAL_RANK=2 is not in [0, KOLO_LOCAL_SIZE=2)");
  expect_error(
      {{"KOLO_RANK", "0"}, {"KOLO_SIZE", "2"}, {"KOLO_LOCAL_RANK", "0"}, {"KOLO_LOCAL_SIZE", "3"}},
      "KOLO_LOCAL_SIZE=3 is not in [1, 2]");
  expect_error({{"KOLO_RANK", "x"}, {"KOLO_SIZE", "2"}}, "KOLO_RANK=\"x\" is not a whole number");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}},
               "MASTER_ADDR is set but MASTER_PORT is not");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}},
               "MASTER_PORT=70000 is not a TCP port");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "p"}},
               "MASTER_PORT=\"p\" is not a whole number");
  expect_error({{"KOLO_RANK", "0"}, {"KOLO_SIZE", "1"}, {"KOLO_STORE_ADDR", "h"}},
               "KOLO_STORE_ADDR is set but KOLO_STORE_PORT is not");
}

}  // namespace
}  // namespace kolo
