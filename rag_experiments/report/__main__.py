from rag_experiments.report.cli import main

raise SystemExit(main())
