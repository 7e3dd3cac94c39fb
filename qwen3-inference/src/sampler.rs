//! Temperature, top-k, top-p, min-p, penalties and a seeded RNG. (Placeholder.)
