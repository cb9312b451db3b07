from rag_experiments.spotcheck.cli import main

raise SystemExit(main())
