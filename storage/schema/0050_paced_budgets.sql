-- Rates per minute and per hour are paced (GCRA, engine/delivery/policies.py): each budget row
-- keeps the theoretical arrival time of its next message beside its window's count.
ALTER TABLE delivery_budgets ADD COLUMN tat TEXT;
