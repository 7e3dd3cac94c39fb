//! Prompt -> prefill -> decode loop -> stop conditions -> stats. (Placeholder.)
