// PLACEHOLDER: shared test helpers (ranks-as-threads harness, references).
#pragma once
