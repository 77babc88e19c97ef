// The host test cases live in src/testing so the CLI's `check` and `bench` share them.
#pragma once
#include "testing/attention_case.hpp"
